package manifests

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// mcpFlows are NeededFlows plus what the mcp pool needs: its MCP servers
// over HTTP(S) outside the namespace (never link-local addresses).
func mcpFlows(r Render, f Flow) bool {
	if NeededFlows(r, f) {
		return true
	}
	src, dst := f.From, f.To
	fromMCP := !src.external() && src.Namespace == r.Namespace && src.Labels["app.kubernetes.io/name"] == "planex-executor-mcp"
	outside := (dst.external() && !dst.IP.IsLinkLocalUnicast()) || (!dst.external() && dst.Namespace != r.Namespace)
	return fromMCP && outside && f.Port.Protocol == corev1.ProtocolTCP && slices.Contains([]int32{80, 443, 8080}, f.Port.Number)
}

// checkMCP runs every check on a render holding the mcp pool, with the
// mcp pool's egress added to the needed flows, and checks the pool itself.
func checkMCP(t *testing.T, r Render) {
	t.Helper()
	var errs []error
	for _, c := range []func() []error{
		r.CheckPodSecurity, r.CheckLabels, r.CheckSelectors, r.CheckPorts, r.CheckImages,
		r.CheckSecrets, r.CheckReferences, r.CheckAutoscaling, r.CheckProbeBudget,
	} {
		errs = append(errs, c()...)
	}
	errs = append(errs, r.CheckFlows(mcpFlows)...)
	if len(errs) > 0 {
		t.Errorf("%s: %d problems:%s", r.Name, len(errs), describe(errs))
	}

	d, ok := r.Find("Deployment", "planex-executor-mcp").(*appsv1.Deployment)
	if !ok {
		t.Fatalf("%s: no Deployment planex-executor-mcp", r.Name)
	}
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if !slices.Contains(c.Args, "--pool=mcp") || !slices.Contains(c.Args, "--mcp-config=/etc/planex/mcp/mcp.json") {
		t.Errorf("%s: args %v", r.Name, c.Args)
	}
	var secretEnv bool
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil && strings.HasPrefix(ef.SecretRef.Name, "planex-mcp") && ef.SecretRef.Optional != nil && *ef.SecretRef.Optional {
			secretEnv = true
		}
	}
	if !secretEnv {
		t.Errorf("%s: the optional Secret planex-mcp is not the source of the config's ${VAR}s: %v", r.Name, c.EnvFrom)
	}
	var cmName string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && strings.HasPrefix(v.ConfigMap.Name, "planex-mcp-config") {
			cmName = v.ConfigMap.Name
		}
	}
	cm, ok := r.Find("ConfigMap", cmName).(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("%s: the mcp config ConfigMap %q is not in the render", r.Name, cmName)
	}
	var cfg struct {
		Servers map[string]struct {
			URL     string            `json:"url"`
			Command string            `json:"command"`
			Headers map[string]string `json:"headers"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(cm.Data["mcp.json"]), &cfg); err != nil || len(cfg.Servers) == 0 {
		t.Fatalf("%s: mcp.json: %v %q", r.Name, err, cm.Data["mcp.json"])
	}
	for name, s := range cfg.Servers {
		if s.URL == "" {
			t.Errorf("%s: server %s: the planex image runs no stdio servers; want a url", r.Name, name)
		}
		for h, v := range s.Headers {
			if strings.Contains(strings.ToLower(h), "authorization") && !strings.Contains(v, "${") {
				t.Errorf("%s: server %s: header %s is inline; take it from the Secret with ${VAR}", r.Name, name, h)
			}
		}
	}
	if np := r.Find("NetworkPolicy", "planex-executor-mcp"); np == nil {
		t.Errorf("%s: no egress NetworkPolicy for the mcp pool", r.Name)
	}
}

func TestMCPPoolComponent(t *testing.T) {
	k := k8sFS(t)
	for _, c := range []Combination{
		{Overlay: "dev", Components: []string{"mcp-pool"}},
		{Overlay: "production", Components: []string{"mcp-pool", "keda"}},
		{Overlay: "production", Components: []string{"keda", "prometheus-operator", "mcp-pool"}, Namespace: "acme-agents"},
	} {
		t.Run(c.Name(), func(t *testing.T) {
			out, err := k.BuildCombination(c)
			if err != nil {
				t.Fatal(err)
			}
			ns := "planex"
			if c.Namespace != "" {
				ns = c.Namespace
			}
			r := decode(t, c.Name(), out, ns, c.Overlay == "dev")
			for _, o := range r.Objects {
				if o.Kind != "Namespace" && o.Namespace != ns {
					t.Errorf("%s: namespace %q, want %q", o.ID(), o.Namespace, ns)
				}
			}
			checkMCP(t, r)
		})
	}
}

func TestMCPPoolHelm(t *testing.T) {
	dir := chartDir(t)
	out, err := HelmTemplate(dir, "agents", filepath.Join(dir, "ci/values-mcp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checkMCP(t, decode(t, "helm+mcp", out, "agents", false))

	// Off by default.
	out, err = HelmTemplate(dir, "agents")
	if err != nil {
		t.Fatal(err)
	}
	if r := decode(t, "helm default", out, "agents", false); r.Find("Deployment", "planex-executor-mcp") != nil {
		t.Error("the mcp pool is rendered without mcp.enabled")
	}

	// The chart's pool has the kustomize component's pod shape.
	kout, err := k8sFS(t).BuildCombination(Combination{Overlay: "production", Components: []string{"mcp-pool"}})
	if err != nil {
		t.Fatal(err)
	}
	hout, err := HelmTemplate(dir, "planex", filepath.Join(dir, "ci/values-mcp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kd := decode(t, "kustomize", kout, "planex", false).Find("Deployment", "planex-executor-mcp").(*appsv1.Deployment)
	hd := decode(t, "helm", hout, "planex", false).Find("Deployment", "planex-executor-mcp").(*appsv1.Deployment)
	ks, hs := kd.Spec.Template.Spec, hd.Spec.Template.Spec
	same := func(what string, a, b any) {
		t.Helper()
		aj, _ := json.Marshal(a)
		bj, _ := json.Marshal(b)
		if string(aj) != string(bj) {
			t.Errorf("%s differs:\n  kustomize %s\n  helm      %s", what, aj, bj)
		}
	}
	same("pod security context", ks.SecurityContext, hs.SecurityContext)
	kc, hc := ks.Containers[0], hs.Containers[0]
	same("args", kc.Args, hc.Args)
	same("container security context", kc.SecurityContext, hc.SecurityContext)
	same("ports", kc.Ports, hc.Ports)
	same("probes", []any{kc.StartupProbe, kc.ReadinessProbe, kc.LivenessProbe}, []any{hc.StartupProbe, hc.ReadinessProbe, hc.LivenessProbe})
	same("volume mounts", kc.VolumeMounts, hc.VolumeMounts)
}

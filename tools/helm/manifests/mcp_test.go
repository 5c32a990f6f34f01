package manifests

import (
	"encoding/json"
	"os"
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

// checkMCP runs every check on a render holding the mcp pool (zero trust
// included), with the mcp pool's egress added to the needed flows, and
// checks the pool itself.
func checkMCP(t *testing.T, r Render) {
	t.Helper()
	var errs []error
	for _, c := range []func() []error{
		r.CheckPodSecurity, r.CheckLabels, r.CheckSelectors, r.CheckPorts, r.CheckImages,
		r.CheckSecrets, r.CheckReferences, r.CheckAutoscaling, r.CheckProbeBudget,
		r.CheckZeroTrust, r.CheckCertificates,
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
	// The pool's own identity: its certificate and nkey seed (NATS user
	// executor-mcp), not another service's; the step verify keys.
	env := r.env(c)
	if r.Insecure {
		if env["PLANEX_STEP_VERIFY_KEYS"] != "" || secretMount(spec, c, "/etc/planex/tls/tls.crt") != "" {
			t.Errorf("%s: the plaintext opt-out still mounts TLS or sets PLANEX_STEP_VERIFY_KEYS", r.Name)
		}
	} else {
		nats := struct{ env, secret string }{"PLANEX_NATS_NKEY_FILE", "planex-nats-executor-mcp"}
		if env["PLANEX_NATS_CREDS_FILE"] != "" { // an external NATS's credentials, shared by every service
			nats = struct{ env, secret string }{"PLANEX_NATS_CREDS_FILE", "nats-creds"}
		}
		for _, want := range []struct{ env, secret string }{
			{"PLANEX_TLS_CERT_FILE", "planex-tls-executor-mcp"},
			nats,
			{"PLANEX_STEP_VERIFY_KEYS", "planex-step-verify"},
		} {
			if got := secretMount(spec, c, env[want.env]); got != want.secret {
				t.Errorf("%s: %s=%q is on Secret %q, want %s", r.Name, want.env, env[want.env], got, want.secret)
			}
		}
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
		{Overlay: "production", Components: []string{"cert-manager", "mcp-pool", "mcp-pool/cert-manager"}},
		{Overlay: "dev", Components: []string{"mcp-pool/cert-manager", "mcp-pool", "cert-manager"}, Namespace: "acme-agents"},
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

	// With cert-manager issuing the pool's certificate, everything on, an
	// external NATS with a credentials Secret, and the explicit plaintext
	// opt-out (no TLS, nkey or verify-key mounts).
	external := filepath.Join(t.TempDir(), "values-external-nats.yaml")
	if err := os.WriteFile(external, []byte("nats:\n  bundled: false\n  external:\n    url: tls://nats.messaging.svc:4222\n    credentialsSecret: nats-creds\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, vf := range []string{"ci/values-cert-manager.yaml", "ci/values-full.yaml", external, "ci/values-insecure.yaml"} {
		if !filepath.IsAbs(vf) {
			vf = filepath.Join(dir, vf)
		}
		out, err := HelmTemplate(dir, "agents", filepath.Join(dir, "ci/values-mcp.yaml"), vf)
		if err != nil {
			t.Fatal(err)
		}
		r := decode(t, "helm+mcp+"+filepath.Base(vf), out, "agents", false)
		r.Insecure = filepath.Base(vf) == "values-insecure.yaml"
		checkMCP(t, r)
	}

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
	same("env names", envNames(kc), envNames(hc))
	// The Secret volumes (the ConfigMap's name carries kustomize's hash).
	secretVolumes := func(vs []corev1.Volume) []corev1.Volume {
		return slices.DeleteFunc(slices.Clone(vs), func(v corev1.Volume) bool { return v.Secret == nil })
	}
	same("Secret volumes", secretVolumes(ks.Volumes), secretVolumes(hs.Volumes))
}

// TestMCPPoolBrokenFails proves the zero-trust checks cover the mcp pool:
// each case breaks its wiring in one way and must be named.
func TestMCPPoolBrokenFails(t *testing.T) {
	k := k8sFS(t)
	// Volumes of the component's Deployment: tmp, tls, nats-creds,
	// step-verify, config, secrets; env: PLANEX_GRPC_ADDR,
	// PLANEX_STEP_VERIFY_KEYS, PLANEX_MAX_ACK_PENDING.
	cases := []struct {
		name, patch, want string
		components        []string
	}{
		{"no verify keys", `
- op: remove
  path: /spec/template/spec/containers/0/env/1`, "planex-executor-mcp: PLANEX_STEP_VERIFY_KEYS not set", nil},
		{"verify keys not mounted", `
- op: remove
  path: /spec/template/spec/volumes/3`, "planex-executor-mcp: PLANEX_STEP_VERIFY_KEYS=/etc/planex/step-verify is on no mounted Secret", nil},
		{"no certificate", `
- op: remove
  path: /spec/template/spec/volumes/1`, "planex-executor-mcp: PLANEX_TLS_CERT_FILE=/etc/planex/tls/tls.crt is on no mounted Secret", nil},
		{"no nkey", `
- op: remove
  path: /spec/template/spec/volumes/2`, "planex-executor-mcp: PLANEX_NATS_NKEY_FILE=/etc/planex/nats/nkey is on no mounted Secret", nil},
		{"probe on the TLS port", `
- op: replace
  path: /spec/template/spec/containers/0/readinessProbe/grpc/port
  value: 7402`, "planex-executor-mcp: readinessProbe on port 7402", nil},
		{"cert-manager without the pool Certificate", "", "TLS Secret planex-tls-executor-mcp has no cert-manager Certificate", []string{"cert-manager"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../overlays/production\ncomponents:\n  - ../../components/mcp-pool\n"
			for _, c := range tc.components {
				kust += "  - ../../components/" + c + "\n"
			}
			if tc.patch != "" {
				kust += "patches:\n  - target: {kind: Deployment, name: planex-executor-mcp}\n    patch: |-" + indent(tc.patch, "      ") + "\n"
			}
			dir := "broken-mcp/" + strings.ReplaceAll(tc.name, " ", "-")
			if err := k.Write(dir+"/kustomization.yaml", kust); err != nil {
				t.Fatal(err)
			}
			out, err := k.Build(dir)
			if err != nil {
				t.Fatal(err)
			}
			r := decode(t, tc.name, out, "planex", false)
			if msgs := describe(r.Check()); !strings.Contains(msgs, tc.want) {
				t.Fatalf("broken mcp pool passed the checks (want an error containing %q); got:%s", tc.want, msgs)
			}
		})
	}
}

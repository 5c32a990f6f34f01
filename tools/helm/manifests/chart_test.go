package manifests

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// valuesFile writes values to a file in a test directory and returns its
// path.
func valuesFile(t testing.TB, values string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// valuesPath is where a workload's values live, by its
// app.kubernetes.io/name.
func valuesPath(name string) string {
	switch {
	case name == "planex-supervisor":
		return "supervisor"
	case name == "planex-planner":
		return "planner"
	case name == "planex-executor-mcp":
		return "mcp"
	case strings.HasPrefix(name, "planex-executor-"):
		return "executors." + strings.TrimPrefix(name, "planex-executor-")
	case name == "planex-console":
		return "console"
	case name == "nats":
		return "nats"
	}
	return ""
}

// allWorkloads turns on every workload the chart can render.
const allWorkloads = `
mcp:
  enabled: true
  config:
    mcpServers:
      tickets: {url: "http://tickets-mcp.tools.svc:8080/mcp"}
console:
  enabled: true
`

// wantWorkloads are the app.kubernetes.io/name of every workload of
// allWorkloads.
var wantWorkloads = []string{"nats", "planex-console", "planex-executor-email", "planex-executor-mcp",
	"planex-executor-search", "planex-executor-sql", "planex-planner", "planex-supervisor"}

func workloadNames(r Render) []string {
	var out []string
	for _, w := range r.Workloads() {
		out = append(out, w.Template.Labels["app.kubernetes.io/name"])
	}
	slices.Sort(out)
	return out
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// pdbFor returns the PodDisruptionBudget selecting the workload's pods.
func pdbFor(r Render, w Workload) *policyv1.PodDisruptionBudget {
	for _, o := range r.Objects {
		if p, ok := o.Obj.(*policyv1.PodDisruptionBudget); ok && selects(p.Spec.Selector, w.Template.Labels) {
			return p
		}
	}
	return nil
}

// TestHelmKnobs sets every placement and metadata knob under defaults and
// checks it lands on every workload (supervisor, planner, each executor
// pool, the mcp pool, NATS, the console), then overrides each per workload
// and checks the workload's value wins: replaced for placement, merged for
// labels and annotations.
func TestHelmKnobs(t *testing.T) {
	global := valuesFile(t, allWorkloads+`
defaults:
  nodeSelector: {pool: general}
  tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: arch, operator: In, values: [amd64]}]}]
  topologySpreadConstraints:
    - {maxSkew: 2, topologyKey: topology.kubernetes.io/region, whenUnsatisfiable: ScheduleAnyway}
  priorityClassName: global-pc
  podLabels: {global: "yes"}
  podAnnotations: {example.com/global: "yes"}
  serviceAccount: {annotations: {example.com/role: global}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 3, maxUnavailable: 0}}
  podDisruptionBudget: {minAvailable: 2}
`)
	r := renderChart(t, HelmOptions{ValueFiles: []string{global}})
	if got := workloadNames(r); !slices.Equal(got, wantWorkloads) {
		t.Fatalf("workloads %v, want %v", got, wantWorkloads)
	}
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		name := w.Template.Labels["app.kubernetes.io/name"]
		if spec.NodeSelector["pool"] != "general" {
			t.Errorf("%s: nodeSelector %v", w.ID(), spec.NodeSelector)
		}
		if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" {
			t.Errorf("%s: tolerations %v", w.ID(), spec.Tolerations)
		}
		if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.PodAntiAffinity != nil {
			t.Errorf("%s: affinity %s, want the global node affinity only", w.ID(), jsonOf(spec.Affinity))
		}
		if len(spec.TopologySpreadConstraints) != 1 || spec.TopologySpreadConstraints[0].MaxSkew != 2 {
			t.Errorf("%s: topologySpreadConstraints %s", w.ID(), jsonOf(spec.TopologySpreadConstraints))
		} else if ls := spec.TopologySpreadConstraints[0].LabelSelector; ls == nil || !selects(ls, w.Template.Labels) || ls.MatchLabels["app.kubernetes.io/instance"] != "planex" {
			t.Errorf("%s: a spread constraint without labelSelector gets the workload's selector; got %s", w.ID(), jsonOf(ls))
		}
		if spec.PriorityClassName != "global-pc" {
			t.Errorf("%s: priorityClassName %q", w.ID(), spec.PriorityClassName)
		}
		if w.Template.Labels["global"] != "yes" || w.Template.Annotations["example.com/global"] != "yes" {
			t.Errorf("%s: pod labels %v annotations %v", w.ID(), w.Template.Labels, w.Template.Annotations)
		}
		sa, _ := r.Find("ServiceAccount", spec.ServiceAccountName).(*corev1.ServiceAccount)
		if sa == nil || sa.Annotations["example.com/role"] != "global" {
			t.Errorf("%s: ServiceAccount %q: %v", w.ID(), spec.ServiceAccountName, sa)
		}
		if p := pdbFor(r, w); p == nil || p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() != 2 {
			t.Errorf("%s: PodDisruptionBudget %v", w.ID(), p)
		}
		switch v := w.Obj.(type) {
		case *appsv1.Deployment:
			ru := v.Spec.Strategy.RollingUpdate
			if name != "planex-executor-search" && (ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 3) {
				t.Errorf("%s: strategy %s", w.ID(), jsonOf(v.Spec.Strategy))
			}
		case *appsv1.StatefulSet:
			// A Deployment strategy is no StatefulSet updateStrategy.
			if v.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType || v.Spec.UpdateStrategy.RollingUpdate != nil {
				t.Errorf("%s: updateStrategy %s", w.ID(), jsonOf(v.Spec.UpdateStrategy))
			}
		}
	}

	// Each workload overrides: its value wins.
	var set []string
	for _, name := range wantWorkloads {
		p := valuesPath(name)
		set = append(set, p+".nodeSelector.own="+name, p+".priorityClassName=own-pc", p+".podLabels.own="+name,
			p+".podAnnotations.example\\.com/global=overridden", p+".serviceAccount.annotations.example\\.com/role="+name,
			p+".podDisruptionBudget.maxUnavailable=1", p+".tolerations[0].key=own", p+".tolerations[0].operator=Exists")
	}
	set = append(set, "nats.strategy.type=OnDelete", "supervisor.strategy.type=Recreate")
	r = renderChart(t, HelmOptions{ValueFiles: []string{global}, Set: set})
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		name := w.Template.Labels["app.kubernetes.io/name"]
		if !maps.Equal(spec.NodeSelector, map[string]string{"own": name}) {
			t.Errorf("%s: nodeSelector %v, want the workload's only", w.ID(), spec.NodeSelector)
		}
		if spec.PriorityClassName != "own-pc" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "own" {
			t.Errorf("%s: priorityClassName %q tolerations %v", w.ID(), spec.PriorityClassName, spec.Tolerations)
		}
		if w.Template.Labels["own"] != name || w.Template.Labels["global"] != "yes" || w.Template.Annotations["example.com/global"] != "overridden" {
			t.Errorf("%s: labels %v annotations %v: want merged, the workload's keys winning", w.ID(), w.Template.Labels, w.Template.Annotations)
		}
		if w.Template.Labels["app.kubernetes.io/name"] != name {
			t.Errorf("%s: podLabels must not replace the chart's labels", w.ID())
		}
		sa, _ := r.Find("ServiceAccount", spec.ServiceAccountName).(*corev1.ServiceAccount)
		if sa == nil || sa.Annotations["example.com/role"] != name {
			t.Errorf("%s: ServiceAccount annotations %v", w.ID(), sa)
		}
		if p := pdbFor(r, w); p == nil || p.Spec.MinAvailable != nil || p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("%s: PodDisruptionBudget %s, want the workload's maxUnavailable 1 only", w.ID(), jsonOf(p))
		}
	}
	if d := r.Find("Deployment", "planex-supervisor").(*appsv1.Deployment); d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("supervisor strategy %s", jsonOf(d.Spec.Strategy))
	}
	if s := r.Find("StatefulSet", "nats").(*appsv1.StatefulSet); s.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("nats updateStrategy %s", jsonOf(s.Spec.UpdateStrategy))
	}

	// No ServiceAccounts and no PDBs when turned off; a named account.
	r = renderChart(t, HelmOptions{ValueFiles: []string{valuesFile(t, allWorkloads)}, Set: []string{
		"defaults.serviceAccount.create=false", "defaults.podDisruptionBudget.enabled=false",
		"supervisor.serviceAccount.name=planex-api", "planner.serviceAccount.create=true"}})
	for _, w := range r.Workloads() {
		sa := w.Template.Spec.ServiceAccountName
		switch w.Template.Labels["app.kubernetes.io/name"] {
		case "planex-supervisor":
			if sa != "planex-api" || r.Find("ServiceAccount", sa) != nil {
				t.Errorf("%s: serviceAccountName %q (want planex-api, not created)", w.ID(), sa)
			}
		case "planex-planner":
			if r.Find("ServiceAccount", sa) == nil {
				t.Errorf("%s: planner.serviceAccount.create=true rendered no ServiceAccount", w.ID())
			}
		default:
			if sa != "default" {
				t.Errorf("%s: serviceAccountName %q, want default", w.ID(), sa)
			}
		}
		if p := pdbFor(r, w); p != nil {
			t.Errorf("%s: a PodDisruptionBudget with podDisruptionBudget.enabled=false", w.ID())
		}
	}

	_, err := tryRenderChart(t, HelmOptions{Set: []string{"planner.podDisruptionBudget.minAvailable=1", "planner.podDisruptionBudget.maxUnavailable=1"}})
	if err == nil || !strings.Contains(err.Error(), "planner.podDisruptionBudget: set minAvailable or maxUnavailable, not both") {
		t.Errorf("both minAvailable and maxUnavailable: %v", err)
	}
}

// checksums returns each workload's checksum/config annotation by its
// app.kubernetes.io/name.
func checksums(t *testing.T, r Render) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, w := range r.Workloads() {
		c := w.Template.Annotations["checksum/config"]
		if c == "" {
			t.Errorf("%s: no checksum/config annotation", w.ID())
		}
		out[w.Template.Labels["app.kubernetes.io/name"]] = c
	}
	return out
}

// TestHelmChecksums: each pod's checksum/config hashes the rendered
// configuration it reads, so a change rolls exactly those workloads.
func TestHelmChecksums(t *testing.T) {
	all := valuesFile(t, allWorkloads)
	base := checksums(t, renderChart(t, HelmOptions{ValueFiles: []string{all}}))
	cases := []struct {
		set  string
		want []string // the workloads that roll
	}{
		{"nats.maxFileStore=5Gi", []string{"nats"}},
		{"nats.replicas=5", []string{"nats"}},
		{"planner.backend=openai", []string{"planex-planner"}},
		{"planner.playbookFiles.a\\.yaml=name: a", []string{"planex-planner"}},
		{"executors.email.from=agents@example.org", []string{"planex-executor-email"}},
		{"mcp.config.mcpServers.tickets.timeout=30s", []string{"planex-executor-mcp"}},
		{"console.allowedHosts[0]=planex.example.com", []string{"planex-console"}},
		{"common.logLevel=debug", []string{"planex-executor-email", "planex-executor-mcp", "planex-executor-search", "planex-executor-sql", "planex-planner", "planex-supervisor"}},
		// Not configuration: nothing rolls for the checksum's sake (the
		// rendered nats.conf is hashed, not the NATS values).
		{"supervisor.replicas=3", nil},
		{"nats.storageClass=fast", nil},
	}
	for _, tc := range cases {
		t.Run(tc.set, func(t *testing.T) {
			got := checksums(t, renderChart(t, HelmOptions{ValueFiles: []string{all}, Set: []string{tc.set}}))
			var rolled []string
			for name, c := range got {
				if base[name] != c {
					rolled = append(rolled, name)
				}
			}
			slices.Sort(rolled)
			if !slices.Equal(rolled, tc.want) {
				t.Errorf("--set %s rolls %v, want %v", tc.set, rolled, tc.want)
			}
		})
	}
}

// TestHelmImageDigest: with image.digest set, every planex container (the
// services, the mcp pool, the console, the NATS reloader sidecar) runs
// repository@digest, as `make release` pins a packaged chart.
func TestHelmImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	r := renderChart(t, HelmOptions{ValueFiles: []string{valuesFile(t, allWorkloads)}, Set: []string{
		"image.repository=registry.example.com/agents/planex", "image.tag=v9.9.9", "image.digest=" + digest}})
	want := "registry.example.com/agents/planex@" + digest
	var pinned []string
	for _, w := range r.Workloads() {
		for _, c := range slices.Concat(w.Template.Spec.InitContainers, w.Template.Spec.Containers) {
			switch {
			case c.Image == want:
				pinned = append(pinned, w.Template.Labels["app.kubernetes.io/name"]+"/"+c.Name)
			case strings.Contains(c.Image, "planex"):
				t.Errorf("%s container %s: image %s, want %s", w.ID(), c.Name, c.Image, want)
			}
		}
	}
	slices.Sort(pinned)
	wantPinned := []string{"nats/reloader", "planex-console/console", "planex-executor-email/executor", "planex-executor-mcp/executor",
		"planex-executor-search/executor", "planex-executor-sql/executor", "planex-planner/planner", "planex-supervisor/supervisor"}
	if !slices.Equal(pinned, wantPinned) {
		t.Errorf("containers on %s: %v, want %v", want, pinned, wantPinned)
	}
	// Without a digest: the tag, defaulting to the chart's appVersion.
	r = renderChart(t, HelmOptions{})
	if c := r.Find("Deployment", "planex-supervisor").(*appsv1.Deployment).Spec.Template.Spec.Containers[0]; c.Image != "ghcr.io/planex-dev/planex:v0.1.0" {
		t.Errorf("default image %s", c.Image)
	}
}

// natsVolume returns the Secret volume name of a pod.
func secretVolume(spec corev1.PodSpec, name string) *corev1.SecretVolumeSource {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v.Secret
		}
	}
	return nil
}

// TestHelmExternalNATS: with an external NATS each service mounts its own
// credentials Secret (one NATS identity per service), the shared Secret
// is only a fallback, the NATS CA is separate from the planex CA, and KEDA
// polls the monitoring endpoint the values name (or fails the render).
func TestHelmExternalNATS(t *testing.T) {
	r := renderChart(t, HelmOptions{ValueFiles: []string{"ci/values-teams.yaml"}})
	common := r.Find("ConfigMap", "planex-common").(*corev1.ConfigMap).Data
	if common["PLANEX_NATS_CREDS_FILE"] != "/etc/planex/nats/creds" || common["PLANEX_NATS_NKEY_FILE"] != "" {
		t.Errorf("planex-common: NATS credentials %q / nkey %q", common["PLANEX_NATS_CREDS_FILE"], common["PLANEX_NATS_NKEY_FILE"])
	}
	if common["PLANEX_NATS_TLS_CA_FILE"] != "/etc/planex/nats-ca/ca.crt" || common["PLANEX_TLS_CA_FILE"] != "/etc/planex/tls/ca.crt" {
		t.Errorf("planex-common: NATS CA %q, planex CA %q", common["PLANEX_NATS_TLS_CA_FILE"], common["PLANEX_TLS_CA_FILE"])
	}
	seen := map[string]string{}
	services := 0
	for _, w := range r.Workloads() {
		if w.Template.Labels["planex.dev/service"] != "true" {
			continue
		}
		services++
		short := strings.TrimPrefix(w.Template.Labels["app.kubernetes.io/name"], "planex-")
		creds := secretVolume(w.Template.Spec, "nats-creds")
		if creds == nil || creds.SecretName != "nats-creds-"+short || len(creds.Items) != 1 || creds.Items[0].Path != "creds" {
			t.Errorf("%s: nats-creds volume %s, want Secret nats-creds-%s as file creds", w.ID(), jsonOf(creds), short)
			continue
		}
		if short == "executor-search" && creds.Items[0].Key != "user.creds" {
			t.Errorf("%s: credentials key %s, want user.creds", w.ID(), creds.Items[0].Key)
		}
		if prev, ok := seen[creds.SecretName]; ok {
			t.Errorf("%s and %s share NATS credentials %s", prev, w.ID(), creds.SecretName)
		}
		seen[creds.SecretName] = w.ID()
		c := w.Template.Spec.Containers[0]
		if s := secretMount(w.Template.Spec, c, "/etc/planex/nats-ca/ca.crt"); s != "messaging-nats-ca" {
			t.Errorf("%s: the NATS CA is on Secret %q, want messaging-nats-ca", w.ID(), s)
		}
		if s := secretMount(w.Template.Spec, c, "/etc/planex/tls/ca.crt"); !strings.HasPrefix(s, "planex-tls-") {
			t.Errorf("%s: the planex CA is on Secret %q", w.ID(), s)
		}
	}
	if services != 5 {
		t.Errorf("%d planex services, want 5", services)
	}
	for _, o := range r.Objects {
		if so, ok := o.Obj.(*ScaledObject); ok {
			for _, tr := range so.Spec.Triggers {
				if ep := tr.Metadata["natsServerMonitoringEndpoint"]; ep != "nats-headless.messaging.svc.cluster.local:8222" {
					t.Errorf("%s: KEDA polls %s, want the value keda.natsMonitoringEndpoint", o.ID(), ep)
				}
			}
		}
	}

	// external is an external NATS with credentials for the services named.
	external := func(ids ...string) string {
		v := "nats:\n  bundled: false\n  external:\n    url: tls://nats.messaging.svc:4222\n    credentials:\n"
		if len(ids) == 0 {
			v = strings.TrimSuffix(v, "    credentials:\n")
		}
		for _, id := range ids {
			v += "      " + id + ": {secretName: nats-creds-" + id + "}\n"
		}
		return valuesFile(t, v)
	}

	// The shared Secret: every service without its own falls back to it.
	r = renderChart(t, HelmOptions{ValueFiles: []string{external()}, Set: []string{"nats.external.credentialsSecret=nats-shared"}})
	for _, w := range r.Workloads() {
		if w.Template.Labels["planex.dev/service"] == "true" {
			if v := secretVolume(w.Template.Spec, "nats-creds"); v == nil || v.SecretName != "nats-shared" {
				t.Errorf("%s: nats-creds %s, want the shared nats-shared", w.ID(), jsonOf(v))
			}
		}
	}
	r = renderChart(t, HelmOptions{ValueFiles: []string{external("supervisor", "planner", "executor-sql", "executor-email")}, Set: []string{
		"nats.external.credentialsSecret=nats-shared"}})
	if v := secretVolume(r.Find("Deployment", "planex-executor-search").(*appsv1.Deployment).Spec.Template.Spec, "nats-creds"); v == nil || v.SecretName != "nats-shared" {
		t.Errorf("search pool without its own credentials: %s, want the fallback nats-shared", jsonOf(v))
	}

	// Neither: the per-service nkey Secrets, as with the bundled NATS.
	r = renderChart(t, HelmOptions{Set: []string{"nats.bundled=false", "nats.external.url=tls://nats.messaging.svc:4222"}})
	if d := r.Find("ConfigMap", "planex-common").(*corev1.ConfigMap).Data; d["PLANEX_NATS_NKEY_FILE"] == "" || d["PLANEX_NATS_TLS_CA_FILE"] != "/etc/planex/tls/ca.crt" {
		t.Errorf("external NATS without credentials: %v", d)
	}

	fails := []struct {
		name  string
		files []string
		set   []string
		want  string
	}{
		{"a service without credentials", []string{external("supervisor", "planner", "executor-sql", "executor-email")}, nil, "nats.external.credentials.executor-search.secretName is required"},
		{"the mcp pool without credentials", []string{"ci/values-teams.yaml"}, []string{"mcp.enabled=true", "mcp.config.mcpServers.t.url=http://t:8080/mcp"}, "nats.external.credentials.executor-mcp.secretName is required"},
		{"KEDA without the endpoint", []string{"ci/values-teams.yaml"}, []string{"keda.natsMonitoringEndpoint="}, "keda.natsMonitoringEndpoint is required"},
	}
	for _, tc := range fails {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tryRenderChart(t, HelmOptions{ValueFiles: tc.files, Set: tc.set})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want an error naming %q; got %v", tc.want, err)
			}
		})
	}

	// Bundled: KEDA polls the release's own headless Service, in the
	// cluster's domain.
	for rel, want := range map[string]string{"planex": "nats-headless.agents.svc.corp.internal:8222", "a": "a-planex-nats-headless.agents.svc.corp.internal:8222"} {
		r := renderChart(t, HelmOptions{Release: rel, Set: []string{"keda.enabled=true", "clusterDomain=corp.internal"}})
		n := 0
		for _, o := range r.Objects {
			if so, ok := o.Obj.(*ScaledObject); ok {
				for _, tr := range so.Spec.Triggers {
					n++
					if ep := tr.Metadata["natsServerMonitoringEndpoint"]; ep != want {
						t.Errorf("release %s %s: KEDA polls %s, want %s", rel, o.ID(), ep, want)
					}
				}
			}
		}
		if n != 4 {
			t.Errorf("release %s: %d KEDA triggers, want 4", rel, n)
		}
	}
}

// TestHelmNamespace: namespace.create renders the namespace with Pod
// Security labels (--create-namespace gives none), kept on uninstall;
// namespaceOverride moves every object.
func TestHelmNamespace(t *testing.T) {
	if r := renderChart(t, HelmOptions{}); slices.ContainsFunc(r.Objects, func(o Object) bool { return o.Kind == "Namespace" }) {
		t.Error("a Namespace without namespace.create")
	}
	for _, tc := range []struct {
		set    []string
		nsName string
	}{
		{[]string{"namespace.create=true"}, "agents"},
		{[]string{"namespace.create=true", "namespaceOverride=team-a"}, "team-a"},
	} {
		r := renderChart(t, HelmOptions{Set: tc.set})
		ns, _ := r.Find("Namespace", tc.nsName).(*corev1.Namespace)
		if ns == nil {
			t.Fatalf("%v: no Namespace %s", tc.set, tc.nsName)
		}
		for _, k := range []string{"enforce", "audit", "warn"} {
			if ns.Labels["pod-security.kubernetes.io/"+k] != "restricted" || ns.Labels["pod-security.kubernetes.io/"+k+"-version"] != "latest" {
				t.Errorf("%v: Namespace labels %v: want pod-security %s restricted", tc.set, ns.Labels, k)
			}
		}
		if ns.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%v: Namespace annotations %v", tc.set, ns.Annotations)
		}
		raw, err := Decode([]byte(mustRender(t, HelmOptions{Set: tc.set})), "")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range raw {
			if o.Kind != "Namespace" && o.Namespace != tc.nsName {
				t.Errorf("%v: %s in namespace %q, want %s", tc.set, o.ID(), o.Namespace, tc.nsName)
			}
		}
		if errs := r.Check(); len(errs) > 0 {
			t.Errorf("%v: %d problems:%s", tc.set, len(errs), describe(errs))
		}
	}
	r := renderChart(t, HelmOptions{Set: []string{"namespace.create=true", "namespace.podSecurity.warn=", "namespace.podSecurity.version=v1.33"}})
	ns := r.Find("Namespace", "agents").(*corev1.Namespace)
	if _, ok := ns.Labels["pod-security.kubernetes.io/warn"]; ok || ns.Labels["pod-security.kubernetes.io/enforce-version"] != "v1.33" {
		t.Errorf("Namespace labels %v", ns.Labels)
	}
}

func mustRender(t *testing.T, o HelmOptions) string {
	t.Helper()
	if o.Namespace == "" {
		o.Namespace = "agents"
	}
	out, err := HelmRender(chartDir(t), o)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestHelmConsole: console.enabled renders the console behind TLS
// (certificate from cert-manager or a Secret), hardened like the services,
// reachable from the ingress controller only and reaching the supervisor
// only; the supervisor's NetworkPolicy admits it.
func TestHelmConsole(t *testing.T) {
	if r := renderChart(t, HelmOptions{}); r.Find("Deployment", "planex-console") != nil {
		t.Error("the console is rendered without console.enabled")
	}
	for _, files := range [][]string{{"ci/values-teams.yaml"}, {"ci/values-cert-manager.yaml"}, nil} {
		r := renderChart(t, HelmOptions{ValueFiles: files, Set: []string{"console.enabled=true", "console.allowedHosts[0]=planex.example.com"}})
		if errs := r.Check(); len(errs) > 0 {
			t.Errorf("%v: %d problems:%s", files, len(errs), describe(errs))
		}
		d, ok := r.Find("Deployment", "planex-console").(*appsv1.Deployment)
		if !ok {
			t.Fatalf("%v: no Deployment planex-console", files)
		}
		c := d.Spec.Template.Spec.Containers[0]
		for _, want := range []string{"console", "--addr=planex-supervisor:7400", "--tls-ca-file=/etc/planex/tls/ca.crt", "--http-addr=:7480",
			"--http-tls-cert-file=/etc/planex/tls/tls.crt", "--http-tls-key-file=/etc/planex/tls/tls.key", "--allowed-hosts=planex.example.com"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("%v: console args %v lack %s", files, c.Args, want)
			}
		}
		if s := secretMount(d.Spec.Template.Spec, c, "/etc/planex/tls/tls.crt"); s != "planex-tls-console" {
			t.Errorf("%v: console certificate on Secret %q", files, s)
		}
		if d.Spec.Template.Labels["planex.dev/service"] != "" {
			t.Errorf("%v: the console is labelled a planex service (NATS and metrics access)", files)
		}
		if _, cm := r.Find("Certificate", "planex-tls-console").(*Certificate); cm != slices.Contains(files, "ci/values-cert-manager.yaml") && cm != slices.Contains(files, "ci/values-teams.yaml") {
			t.Errorf("%v: console Certificate rendered %v", files, cm)
		}
		sup := r.Find("NetworkPolicy", "planex-supervisor").(*networkingv1.NetworkPolicy)
		if !strings.Contains(jsonOf(sup.Spec.Ingress), `"app.kubernetes.io/name":"planex-console"`) {
			t.Errorf("%v: the supervisor's NetworkPolicy does not admit the console: %s", files, jsonOf(sup.Spec.Ingress))
		}
		console := Endpoint{Name: "planex-console", Namespace: "agents", Labels: d.Spec.Template.Labels, Spec: &d.Spec.Template.Spec}
		var supervisor, nats, planner Endpoint
		for _, e := range r.Endpoints() {
			switch e.Labels["app.kubernetes.io/name"] {
			case "planex-supervisor":
				supervisor = e
			case "nats":
				nats = e
			case "planex-planner":
				planner = e
			}
		}
		tcp := func(n int32) Port { return Port{corev1.ProtocolTCP, n} }
		flows := []struct {
			f    Flow
			want bool
		}{
			{Flow{PeerIngressController, console, ConsolePort}, true},
			{Flow{console, supervisor, tcp(7400)}, true},
			{Flow{PeerStranger, console, ConsolePort}, false},
			{Flow{PeerClient, console, ConsolePort}, false},
			{Flow{console, planner, tcp(7401)}, false},
			{Flow{console, PeerInternet4, tcp(443)}, false},
		}
		if nats.Spec != nil {
			flows = append(flows, struct {
				f    Flow
				want bool
			}{Flow{console, nats, tcp(4222)}, false})
		}
		for _, fl := range flows {
			if got := r.Allowed(fl.f); got != fl.want {
				t.Errorf("%v: %s allowed %v, want %v", files, fl.f, got, fl.want)
			}
		}
	}

	// A Secret of the operator's instead of cert-manager's, and another CA
	// for the supervisor.
	r := renderChart(t, HelmOptions{ValueFiles: []string{"ci/values-cert-manager.yaml"}, Set: []string{
		"console.enabled=true", "console.tls.secretName=console-public", "console.supervisorCA.secretName=planex-ca"}})
	if r.Find("Certificate", "planex-tls-console") != nil {
		t.Error("a console Certificate although console.tls.secretName names the Secret")
	}
	d := r.Find("Deployment", "planex-console").(*appsv1.Deployment)
	c := d.Spec.Template.Spec.Containers[0]
	if s := secretMount(d.Spec.Template.Spec, c, "/etc/planex/tls/tls.crt"); s != "console-public" || !slices.Contains(c.Args, "--tls-ca-file=/etc/planex/supervisor-ca/ca.crt") {
		t.Errorf("console on %s with args %v", s, c.Args)
	}
	if errs := r.Check(); len(errs) > 0 {
		t.Errorf("%d problems:%s", len(errs), describe(errs))
	}

	_, err := tryRenderChart(t, HelmOptions{ValueFiles: []string{"ci/values-insecure.yaml"}, Set: []string{"console.enabled=true"}})
	if err == nil || !strings.Contains(err.Error(), "console.enabled with security.insecurePlaintext") {
		t.Errorf("console on a plaintext render: %v", err)
	}
}

// TestHelmBrokenReleaseFails proves the checks follow the chart's names
// and the console: each case breaks a render of release "a" and must be
// named.
func TestHelmBrokenReleaseFails(t *testing.T) {
	cases := []struct {
		name  string
		files []string
		set   []string
		patch func(r Render)
		want  string
	}{
		{"KEDA polls the headless Service of a NATS that is not there", []string{"ci/values-teams.yaml"},
			[]string{"keda.natsMonitoringEndpoint=nats-headless.agents.svc.cluster.local:8222"}, nil,
			"names Service nats-headless of namespace agents, which does not exist"},
		{"KEDA polls another release's NATS", nil, []string{"keda.enabled=true", "keda.natsMonitoringEndpoint=b-planex-nats-headless.agents.svc.cluster.local:8222"}, nil,
			`want "a-planex-nats-headless.agents.svc.cluster.local:8222"`},
		{"console to the supervisor in plaintext", []string{"ci/values-teams.yaml"}, nil, func(r Render) {
			c := &r.Find("Deployment", "a-planex-console").(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--plaintext")
		}, "console --plaintext"},
		{"console certificate not on a Secret", []string{"ci/values-teams.yaml"}, nil, func(r Render) {
			c := &r.Find("Deployment", "a-planex-console").(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
			for i, a := range c.Args {
				if strings.HasPrefix(a, "--http-tls-cert-file=") {
					c.Args[i] = "--http-tls-cert-file=/tmp/tls.crt"
				}
			}
		}, "console --http-tls-cert-file=/tmp/tls.crt is on no mounted Secret"},
		{"the release's signing key in an executor", nil, nil, func(r Render) {
			spec := &r.Find("Deployment", "a-planex-executor-sql").(*appsv1.Deployment).Spec.Template.Spec
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "stolen", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "a-planex-step-signing"}}})
			spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "stolen", MountPath: "/etc/planex/stolen"})
		}, "mounts the step signing key (Secret a-planex-step-signing)"},
		{"certificate without the release's Service name", []string{"ci/values-cert-manager.yaml"}, nil, func(r Render) {
			c := r.Find("Certificate", "a-planex-tls-planner").(*Certificate)
			c.Spec.DNSNames = []string{"planex-planner"}
		}, "lack the Service name a-planex-planner"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := renderChart(t, HelmOptions{Release: "a", ValueFiles: tc.files, Set: tc.set})
			// The flows of a release not named planex are checked by
			// TestHelmTwoReleases (NeededFlows looks objects up by the
			// names of release planex).
			if errs := r.CheckButNetworkPolicies(); len(errs) > 0 && tc.patch != nil {
				t.Fatalf("the render before the break: %d problems:%s", len(errs), describe(errs))
			}
			if tc.patch != nil {
				tc.patch(r)
			}
			if msgs := describe(r.CheckButNetworkPolicies()); !strings.Contains(msgs, tc.want) {
				t.Errorf("broken render passed (want an error containing %q); got:%s", tc.want, msgs)
			}
		})
	}
}

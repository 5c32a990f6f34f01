package manifests

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// repoRoot is the planex repository (this file is tools/helm/manifests).
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

func k8sFS(t testing.TB) *KustomizeFS {
	t.Helper()
	k, err := NewKustomizeFS(filepath.Join(repoRoot(t), "deploy", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func chartDir(t testing.TB) string { return filepath.Join(repoRoot(t), "deploy", "helm", "planex") }

func decode(t testing.TB, name string, data []byte, ns string, dev bool) Render {
	t.Helper()
	objs, err := Decode(data, ns)
	if err != nil {
		t.Fatalf("%s: decode: %v", name, err)
	}
	return Render{Name: name, Namespace: ns, Objects: objs, DevSecrets: dev}
}

// combinations are the overlays with every subset of the components they
// do not already include, in both orders, and with another namespace;
// components/policy (which composes with all of them: it only adds a
// ConfigMap and patches the supervisor) alone, after and before all the
// others, and in the namespaced combination; components/grafana-dashboards
// and components/tenants (a ConfigMap and a patch of the supervisor, like
// policy) with all the others, tenants also alone.
func combinations() []Combination {
	var cs []Combination
	extra := map[string][]string{
		"dev":        {"keda", "search-pvc", "prometheus-operator", "cert-manager"},
		"production": {"keda", "prometheus-operator", "cert-manager"},
	}
	for _, overlay := range []string{"dev", "production"} {
		comps := extra[overlay]
		for mask := 0; mask < 1<<len(comps); mask++ {
			var sub []string
			for i, c := range comps {
				if mask&(1<<i) != 0 {
					sub = append(sub, c)
				}
			}
			cs = append(cs, Combination{Overlay: overlay, Components: sub})
			if len(sub) > 1 {
				rev := slices.Clone(sub)
				slices.Reverse(rev)
				cs = append(cs, Combination{Overlay: overlay, Components: rev})
			}
		}
		// policy and grafana-dashboards only add ConfigMaps (and policy a
		// patch of the supervisor): with all the others, not every subset.
		all := append(slices.Clone(comps), "policy", "grafana-dashboards", "tenants")
		cs = append(cs,
			Combination{Overlay: overlay, Components: []string{"policy"}},
			Combination{Overlay: overlay, Components: []string{"tenants"}},
			Combination{Overlay: overlay, Components: all},
			Combination{Overlay: overlay, Components: append([]string{"policy"}, comps...)},
			Combination{Overlay: overlay, Components: all, Namespace: "acme-agents"},
		)
	}
	return cs
}

func TestKustomizeRenders(t *testing.T) {
	k := k8sFS(t)
	byComponents := map[string]string{}
	for _, c := range combinations() {
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
			if slices.Contains(c.Components, "policy") {
				checkPolicy(t, out, ns)
			}
			// Read without a default namespace: a component's resource
			// that names none lands in whatever namespace kubectl uses,
			// not the overlay's.
			raw, err := Decode(out, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range raw {
				if o.Kind == "Namespace" {
					if o.Name != ns {
						t.Errorf("%s: want Namespace %s", o.ID(), ns)
					}
				} else if o.Namespace != ns {
					t.Errorf("%s: namespace %q, want %q", o.ID(), o.Namespace, ns)
				}
			}
			if errs := r.Check(); len(errs) > 0 {
				t.Errorf("%d problems:%s", len(errs), describe(errs))
			}
			// The order components are listed in must not matter.
			sorted := slices.Clone(c.Components)
			slices.Sort(sorted)
			key := c.Overlay + strings.Join(sorted, ",") + "@" + c.Namespace
			// Same objects; kustomize lists them in the order it met them.
			docs := strings.Split(string(out), "\n---\n")
			for i := range docs {
				docs[i] = strings.TrimSpace(docs[i])
			}
			slices.Sort(docs)
			norm := strings.Join(docs, "\n---\n")
			if prev, ok := byComponents[key]; ok && prev != norm {
				a, b := strings.Split(prev, "\n---\n"), docs
				for i := range min(len(a), len(b)) {
					if a[i] != b[i] {
						t.Errorf("render depends on the order of components %v: first difference\n%s\n---- vs ----\n%s", c.Components, a[i], b[i])
						break
					}
				}
			}
			byComponents[key] = norm
		})
	}
}

// helmValues are the values files CI renders the chart with.
var helmValues = [][]string{
	nil,
	{"ci/values-minimal.yaml"},
	{"ci/values-full.yaml"},
	{"ci/values-dev.yaml"},
	{"ci/values-dev.yaml", "ci/values-full.yaml"},
	{"ci/values-cert-manager.yaml"},
	{"ci/values-insecure.yaml"},
	{"ci/values-teams.yaml"},
	{"ci/values-tenants.yaml"},
}

func TestHelmRenders(t *testing.T) {
	dir := chartDir(t)
	for _, vf := range helmValues {
		name := "default"
		if len(vf) > 0 {
			name = strings.Join(vf, "+")
		}
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			var files []string
			for _, f := range vf {
				files = append(files, filepath.Join(dir, f))
			}
			out, err := HelmTemplate(dir, "agents", files...)
			if err != nil {
				t.Fatal(err)
			}
			r := decode(t, name, out, "agents", false)
			// The explicit plaintext opt-out is the only render allowed
			// without TLS, credentials and signed steps.
			r.Insecure = slices.Contains(vf, "ci/values-insecure.yaml")
			if errs := r.Check(); len(errs) > 0 {
				t.Errorf("%d problems:%s", len(errs), describe(errs))
			}
		})
	}
}

// TestHelmMatchesKustomize compares the chart (default values, release
// "planex") with the kustomize base: the same object names, the same
// workloads with the same security contexts, probes and ports, the same
// Services' ports and the same NetworkPolicies. The chart's selectors also
// name the release (app.kubernetes.io/instance, so that two releases in
// one namespace never select each other's pods; kustomize has one
// instance per namespace): that label is dropped from the chart's
// selectors before they are compared.
func TestHelmMatchesKustomize(t *testing.T) {
	kout, err := k8sFS(t).Build("base")
	if err != nil {
		t.Fatal(err)
	}
	kr := decode(t, "kustomize base", kout, "planex", false)
	hout, err := HelmTemplate(chartDir(t), "planex")
	if err != nil {
		t.Fatal(err)
	}
	hr := decode(t, "helm default", hout, "planex", false)

	names := func(r Render, kind string) []string {
		var ns []string
		for _, o := range r.Objects {
			if o.Kind == kind {
				ns = append(ns, o.Name)
			}
		}
		slices.Sort(ns)
		return ns
	}
	for _, kind := range []string{"Deployment", "StatefulSet", "Service", "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceAccount"} {
		if k, h := names(kr, kind), names(hr, kind); !slices.Equal(k, h) {
			t.Errorf("%s: kustomize has %v, helm has %v", kind, k, h)
		}
	}
	same := func(what string, k, h any) {
		t.Helper()
		kj, _ := json.Marshal(k)
		hj, _ := json.Marshal(h)
		if string(kj) != string(hj) {
			t.Errorf("%s differs:\n  kustomize %s\n  helm      %s", what, kj, hj)
		}
	}
	for _, kw := range kr.Workloads() {
		var hw *Workload
		for _, w := range hr.Workloads() {
			if w.Kind == kw.Kind && w.Name == kw.Name {
				hw = &w
			}
		}
		if hw == nil {
			continue // reported above
		}
		ks, hs := kw.Template.Spec, hw.Template.Spec
		same(kw.ID()+" pod securityContext", ks.SecurityContext, hs.SecurityContext)
		same(kw.ID()+" automountServiceAccountToken", ks.AutomountServiceAccountToken, hs.AutomountServiceAccountToken)
		same(kw.ID()+" terminationGracePeriodSeconds", ks.TerminationGracePeriodSeconds, hs.TerminationGracePeriodSeconds)
		same(kw.ID()+" selector", withoutInstance(t, kw.Selector), withoutInstance(t, hw.Selector))
		if len(ks.Containers) != len(hs.Containers) {
			t.Errorf("%s: kustomize has %d containers, helm %d", kw.ID(), len(ks.Containers), len(hs.Containers))
			continue
		}
		for i, kc := range ks.Containers {
			hc := hs.Containers[i]
			id := kw.ID() + " container " + kc.Name
			same(id+" name", kc.Name, hc.Name)
			same(id+" args", kc.Args, hc.Args)
			same(id+" securityContext", kc.SecurityContext, hc.SecurityContext)
			same(id+" ports", kc.Ports, hc.Ports)
			same(id+" startupProbe", kc.StartupProbe, hc.StartupProbe)
			same(id+" readinessProbe", kc.ReadinessProbe, hc.ReadinessProbe)
			same(id+" livenessProbe", kc.LivenessProbe, hc.LivenessProbe)
			same(id+" lifecycle", kc.Lifecycle, hc.Lifecycle)
			same(id+" resources", kc.Resources, hc.Resources)
			same(id+" env names", envNames(kc), envNames(hc))
		}
	}
	for _, name := range names(kr, "Service") {
		ks, _ := kr.Find("Service", name).(*corev1.Service)
		hs, _ := hr.Find("Service", name).(*corev1.Service)
		if ks != nil && hs != nil {
			same("Service "+name+" ports", ks.Spec.Ports, hs.Spec.Ports)
			same("Service "+name+" selector", withoutInstance(t, ks.Spec.Selector), withoutInstance(t, hs.Spec.Selector))
		}
	}
	for _, name := range names(kr, "NetworkPolicy") {
		kp, _ := kr.Find("NetworkPolicy", name).(*networkingv1.NetworkPolicy)
		hp, _ := hr.Find("NetworkPolicy", name).(*networkingv1.NetworkPolicy)
		if kp != nil && hp != nil {
			same("NetworkPolicy "+name, withoutInstance(t, kp.Spec), withoutInstance(t, hp.Spec))
		}
	}
}

// withoutInstance returns v (a selector or an object holding selectors) as
// generic JSON (map keys in one order, whatever the Go type) and
// without the app.kubernetes.io/instance label; a matchLabels
// left empty is dropped, so {matchLabels: {instance: x}} compares equal to {}.
func withoutInstance(t testing.TB, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var g any
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	var walk func(any) any
	walk = func(n any) any {
		switch x := n.(type) {
		case map[string]any:
			delete(x, "app.kubernetes.io/instance")
			for k, c := range x {
				x[k] = walk(c)
				if m, ok := x[k].(map[string]any); ok && k == "matchLabels" && len(m) == 0 {
					delete(x, k)
				}
			}
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		}
		return n
	}
	return walk(g)
}

func envNames(c corev1.Container) []string {
	var ns []string
	for _, e := range c.Env {
		ns = append(ns, e.Name)
	}
	slices.Sort(ns)
	return ns
}

// TestBrokenManifestsFail proves the checks catch what they claim: each
// case breaks the production render in one way and must produce an error
// naming the problem.
func TestBrokenManifestsFail(t *testing.T) {
	k := k8sFS(t)
	cases := []struct {
		name  string
		patch string
		want  string
	}{
		{"probe port missing", `
- op: replace
  path: /spec/template/spec/containers/0/readinessProbe/grpc/port
  value: 7499`, "readinessProbe port 7499 is not a port of the container"},
		{"root user", `
- op: replace
  path: /spec/template/spec/containers/0/securityContext/runAsUser
  value: 0`, "violates PodSecurity restricted"},
		{"floating image", `
- op: replace
  path: /spec/template/spec/containers/0/image
  value: ghcr.io/planex-dev/planex:latest`, "is not pinned"},
		{"inline password", `
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: {name: PLANEX_SMTP_PASSWORD, value: hunter2}`, "inline value"},
		{"selector mismatch", `
- op: replace
  path: /spec/template/metadata/labels/app.kubernetes.io~1name
  value: planex-elsewhere`, "does not match its pod template labels"},
		{"unknown field", `
- op: add
  path: /spec/template/spec/containers/0/securityContex
  value: {runAsUser: 0}`, "strict decode"},
		{"short startup probe", `
- op: replace
  path: /spec/template/spec/containers/0/startupProbe/failureThreshold
  value: 30`, "startupProbe allows 60s"},
		{"plaintext opt-out", `
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: {name: PLANEX_PLAINTEXT, value: "true"}`, "PLANEX_PLAINTEXT=true in a render that is not an explicit plaintext opt-out"},
		{"authentication off", `
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: {name: PLANEX_AUTH_DISABLED, value: "true"}`, "PLANEX_AUTH_DISABLED=true"},
		{"signing key not mounted", `
- op: remove
  path: /spec/template/spec/containers/0/volumeMounts/3`, "PLANEX_STEP_SIGNING_KEY_FILE=/etc/planex/step-signing/step-signing.key is on no mounted Secret"},
		{"no API authentication", `
- op: remove
  path: /spec/template/spec/containers/0/env/2`, "PLANEX_AUTH_API_KEYS_FILE or PLANEX_AUTH_JWKS_FILE or PLANEX_AUTH_JWKS_URL not set"},
		{"probe on the TLS port", `
- op: replace
  path: /spec/template/spec/containers/0/livenessProbe/grpc/port
  value: 7400`, "livenessProbe on port 7400"},
		{"signing key in an executor", `
- op: add
  path: /spec/template/spec/volumes/-
  value: {name: stolen, secret: {secretName: planex-step-signing}}
- op: add
  path: /spec/template/spec/containers/0/volumeMounts/-
  value: {name: stolen, mountPath: /etc/planex/stolen}`, "mounts the step signing key (Secret planex-step-signing); only the supervisor may"},
		{"executor without verify keys", `
- op: remove
  path: /spec/template/spec/volumes/3`, "PLANEX_STEP_VERIFY_KEYS=/etc/planex/step-verify is on no mounted Secret"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			target := "planex-supervisor"
			if strings.Contains(tc.name, "executor") {
				target = "planex-executor-sql"
			}
			kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../overlays/production
patches:
  - target: {kind: Deployment, name: ` + target + `}
    patch: |-` + indent(tc.patch, "      ") + "\n"
			dir := "broken/" + strings.ReplaceAll(tc.name, " ", "-")
			if err := k.Write(dir+"/kustomization.yaml", kust); err != nil {
				t.Fatal(err)
			}
			out, err := k.Build(dir)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(out, "planex")
			errs := []error{}
			if err != nil {
				errs = append(errs, err)
			} else {
				errs = Render{Name: tc.name, Namespace: "planex", Objects: objs}.Check()
			}
			if !strings.Contains(describe(errs), tc.want) {
				t.Fatalf("broken manifest passed the checks (want an error containing %q); got:%s", tc.want, describe(errs))
			}
		})
	}
	// A NetworkPolicy that opens everything to everyone, and a KEDA
	// ScaledObject on the search pool with a hard-coded namespace.
	extra := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-all
spec:
  podSelector: {}
  policyTypes: ["Ingress", "Egress"]
  ingress: [{}]
  egress: [{}]
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: planex-executor-search
spec:
  scaleTargetRef: {name: planex-executor-search}
  triggers:
    - type: nats-jetstream
      metadata: {natsServerMonitoringEndpoint: nats-headless.planex.svc.cluster.local:8222, stream: PLANEX_STEPS, consumer: pool-search}
`
	if err := k.Write("broken/open/extra.yaml", extra); err != nil {
		t.Fatal(err)
	}
	if err := k.Write("broken/open/kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: other\nresources:\n  - ../../overlays/dev\n  - extra.yaml\n"); err != nil {
		t.Fatal(err)
	}
	out, err := k.Build("broken/open")
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "open", out, "other", true)
	msgs := describe(r.Check())
	for _, want := range []string{"is allowed but not needed", "KEDA must not scale the search pool", "want \"nats-headless.other.svc.cluster.local:8222\"",
		"want the pool's consumers on both PLANEX_STEPS and PLANEX_EVENTS"} {
		if !strings.Contains(msgs, want) {
			t.Errorf("broken render passed: want an error containing %q; got:%s", want, msgs)
		}
	}
}

func indent(s, pre string) string {
	lines := strings.Split(strings.TrimLeft(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pre + l
	}
	return "\n" + strings.Join(lines, "\n")
}

// The flow model itself: a default-deny namespace denies, an allow rule
// allows exactly its port.
func TestAllowedModel(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := func(n int32) []networkingv1.NetworkPolicyPort {
		p := intstrFrom(n)
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
	}
	a := &appsv1.Deployment{}
	a.Spec.Template.Labels = map[string]string{"app": "a"}
	b := &appsv1.Deployment{}
	b.Spec.Template.Labels = map[string]string{"app": "b"}
	deny := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Ingress", "Egress"}}}
	allow := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: *sel("app", "b"), PolicyTypes: []networkingv1.PolicyType{"Ingress"},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "a")}}, Ports: port(80)}},
	}}
	egress := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: *sel("app", "a"), PolicyTypes: []networkingv1.PolicyType{"Egress"},
		Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: port(80)}},
	}}
	r := Render{Namespace: "ns", Objects: []Object{
		{Kind: "Deployment", Name: "a", Namespace: "ns", Obj: a},
		{Kind: "Deployment", Name: "b", Namespace: "ns", Obj: b},
		{Kind: "NetworkPolicy", Name: "deny", Namespace: "ns", Obj: deny},
		{Kind: "NetworkPolicy", Name: "allow", Namespace: "ns", Obj: allow},
	}}
	ea := Endpoint{Name: "a", Namespace: "ns", Labels: a.Spec.Template.Labels}
	eb := Endpoint{Name: "b", Namespace: "ns", Labels: b.Spec.Template.Labels}
	if r.Allowed(Flow{ea, eb, Port{tcp, 80}}) {
		t.Error("a -> b:80 allowed without an egress rule for a")
	}
	r.Objects = append(r.Objects, Object{Kind: "NetworkPolicy", Name: "egress", Namespace: "ns", Obj: egress})
	if !r.Allowed(Flow{ea, eb, Port{tcp, 80}}) {
		t.Error("a -> b:80 denied with ingress and egress rules")
	}
	if r.Allowed(Flow{ea, eb, Port{tcp, 81}}) {
		t.Error("a -> b:81 allowed")
	}
	if r.Allowed(Flow{eb, ea, Port{tcp, 80}}) {
		t.Error("b -> a:80 allowed")
	}
	if !reflect.DeepEqual(r.Endpoints()[0].Labels, a.Spec.Template.Labels) {
		t.Error("endpoint labels")
	}
}

// TestInsecureRenderIsFlagged: the chart's plaintext opt-out passes only
// as an explicitly Insecure render; taken for a production render, the
// zero-trust checks name each insecure setting.
func TestInsecureRenderIsFlagged(t *testing.T) {
	dir := chartDir(t)
	out, err := HelmTemplate(dir, "agents", filepath.Join(dir, "ci/values-insecure.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "insecure", out, "agents", false)
	msgs := describe(r.Check())
	for _, want := range []string{"PLANEX_PLAINTEXT=true", "PLANEX_AUTH_DISABLED=true", "PLANEX_ALLOW_UNSIGNED_STEPS=true", "nats.conf has no cert_file"} {
		if !strings.Contains(msgs, want) {
			t.Errorf("insecure render checked as production: want an error containing %q; got:%s", want, msgs)
		}
	}
	r.Insecure = true
	if errs := r.Check(); len(errs) > 0 {
		t.Errorf("the explicit opt-out render: %d problems:%s", len(errs), describe(errs))
	}
}

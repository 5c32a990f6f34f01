package manifests

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// webhookValues is the CI values file with the supervisor's trigger
// webhooks on, behind ingress-nginx (docs/triggers.md, "Deploying the
// webhook").
const webhookValues = "ci/values-webhook.yaml"

// webhookPort is the webhook port of webhookValues (the chart's default).
var webhookPort = Port{corev1.ProtocolTCP, 7481}

// webhookFlows is need plus the webhook's one path: into the supervisor's
// webhook port from the ingress controller's pods (restricted, as
// supervisor.webhook.ingressFrom in webhookValues) or from anything
// outside the namespace but link-local addresses (an empty ingressFrom).
// The namespace's own pods keep their egress rules: none reaches it.
func webhookFlows(need FlowPolicy, restricted bool) FlowPolicy {
	return func(r Render, f Flow) bool {
		if need(r, f) {
			return true
		}
		to := f.To
		if to.external() || to.Namespace != r.Namespace || to.Labels["app.kubernetes.io/name"] != "planex-supervisor" || f.Port != webhookPort {
			return false
		}
		from := f.From
		if restricted {
			return !from.external() && from.Name == PeerIngressController.Name && from.Namespace == PeerIngressController.Namespace
		}
		if from.external() {
			return !from.IP.IsLinkLocalUnicast()
		}
		return from.Namespace != r.Namespace
	}
}

// supervisorContainer returns the supervisor's pod spec and container, or
// fails.
func supervisorContainer(t *testing.T, r Render) (*corev1.PodSpec, corev1.Container) {
	t.Helper()
	d := deployment(t, r, "planex-supervisor")
	return &d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0]
}

// TestHelmWebhook renders the supervisor's trigger webhooks on: the
// supervisor gets --webhook-addr and --webhook-secrets-dir (PLANEX_*), the
// port and the operator's Secret mounted read-only as a directory; a
// Service carries the webhook port alone; the Ingress routes /v1/hooks/ of
// its host and nothing else; the NetworkPolicies admit the webhook port
// from ingressFrom (or, empty, from anywhere but link-local) and every
// other flow stays exactly what planex needs; the supervisor's own policy
// is the one of a render without webhooks.
func TestHelmWebhook(t *testing.T) {
	plain := renderChart(t, HelmOptions{})
	cases := []struct {
		name  string
		files []string
		set   []string
		// open: ingressFrom empty, the port admitted from anywhere.
		open, insecure, console bool
		// ingress: the Ingress is rendered (with host and TLS of webhookValues).
		ingress bool
	}{
		{name: "ingress-nginx", files: []string{webhookValues}, ingress: true},
		{name: "open, no ingress", files: []string{webhookValues}, set: []string{"supervisor.webhook.ingressFrom=null", "supervisor.webhook.ingress.enabled=false"}, open: true},
		{name: "with the console", files: []string{webhookValues}, set: []string{"console.enabled=true"}, console: true, ingress: true},
		{name: "insecure", files: []string{"ci/values-insecure.yaml", webhookValues}, insecure: true, ingress: true},
		{name: "cert-manager", files: []string{"ci/values-cert-manager.yaml", webhookValues}, ingress: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := renderChart(t, HelmOptions{ValueFiles: tc.files, Set: tc.set})
			r.Insecure = tc.insecure
			need, peers, ports := NeededFlows, []Endpoint{PeerIngressController}, []Port{webhookPort}
			if tc.console {
				need, ports = ConsoleFlows, append(ports, ConsolePort)
			}
			errs := append(r.CheckButNetworkPolicies(), r.CheckNetworkPoliciesWith(webhookFlows(need, !tc.open), peers, ports)...)
			if len(errs) > 0 {
				t.Fatalf("%d problems:%s", len(errs), describe(errs))
			}

			// The supervisor: flags, port, mount.
			spec, c := supervisorContainer(t, r)
			env := r.env(c)
			if env["PLANEX_WEBHOOK_ADDR"] != ":7481" || env["PLANEX_WEBHOOK_SECRETS_DIR"] != "/etc/planex/webhook-secrets" {
				t.Errorf("supervisor PLANEX_WEBHOOK_ADDR=%q PLANEX_WEBHOOK_SECRETS_DIR=%q", env["PLANEX_WEBHOOK_ADDR"], env["PLANEX_WEBHOOK_SECRETS_DIR"])
			}
			if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhook" && p.ContainerPort == 7481 }) {
				t.Errorf("supervisor ports %s: no webhook 7481", jsonOf(c.Ports))
			}
			v := volume(t, deployment(t, r, "planex-supervisor"), "/etc/planex/webhook-secrets")
			if v.Secret == nil || v.Secret.SecretName != "planex-webhook-secrets" || len(v.Secret.Items) != 0 || v.Secret.Optional != nil && *v.Secret.Optional {
				t.Errorf("webhook secrets volume %s: want the whole Secret planex-webhook-secrets, not optional", jsonOf(v))
			} else if m := *v.Secret.DefaultMode; m != 0o440 {
				t.Errorf("webhook secrets mode %o, want 440", m)
			}
			if got := secretMount(*spec, c, env["PLANEX_WEBHOOK_SECRETS_DIR"]); got != "planex-webhook-secrets" {
				t.Errorf("--webhook-secrets-dir lies on %q, want Secret planex-webhook-secrets", got)
			}

			// The Service: the webhook port alone, on the supervisor's pods.
			svc, _ := r.Find("Service", "planex-supervisor-webhook").(*corev1.Service)
			if svc == nil {
				t.Fatal("no Service planex-supervisor-webhook")
			}
			wantProto := "https"
			if tc.insecure {
				wantProto = "http"
			}
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 7481 || svc.Spec.Ports[0].TargetPort != intstr.FromString("webhook") ||
				svc.Spec.Ports[0].AppProtocol == nil || *svc.Spec.Ports[0].AppProtocol != wantProto {
				t.Errorf("Service planex-supervisor-webhook ports %s: want webhook 7481 alone, appProtocol %s", jsonOf(svc.Spec.Ports), wantProto)
			}
			if svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Annotations["example.com/team"] != "agents" {
				t.Errorf("Service planex-supervisor-webhook type %s annotations %v", svc.Spec.Type, svc.Annotations)
			}
			for _, w := range r.Workloads() {
				if !selectsSet(svc.Spec.Selector, w.Template.Labels) {
					continue
				}
				if w.Template.Labels["app.kubernetes.io/name"] != "planex-supervisor" {
					t.Errorf("Service planex-supervisor-webhook selects %s", w.ID())
				}
			}

			// The Ingress: /v1/hooks/ of the host, to that Service.
			ing, _ := r.Find("Ingress", "planex-supervisor-webhook").(*networkingv1.Ingress)
			if (ing != nil) != tc.ingress {
				t.Fatalf("Ingress planex-supervisor-webhook rendered %v, want %v", ing != nil, tc.ingress)
			}
			if ing != nil {
				checkWebhookIngress(t, ing)
			}

			// The NetworkPolicies: the webhook rule, and the supervisor's
			// own policy as without webhooks.
			np, _ := r.Find("NetworkPolicy", "planex-supervisor-webhook").(*networkingv1.NetworkPolicy)
			if np == nil || len(np.Spec.Ingress) != 1 || len(np.Spec.Egress) != 0 || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
				t.Fatalf("NetworkPolicy planex-supervisor-webhook %s: want one ingress rule and no egress", jsonOf(np))
			}
			rule := np.Spec.Ingress[0]
			if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || *rule.Ports[0].Port != intstr.FromInt32(7481) {
				t.Errorf("webhook rule ports %s, want 7481 alone", jsonOf(rule.Ports))
			}
			open := slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool {
				return p.IPBlock != nil && p.IPBlock.CIDR == "0.0.0.0/0"
			})
			if open != tc.open {
				t.Errorf("webhook rule from %s: open to any address %v, want %v", jsonOf(rule.From), open, tc.open)
			}
			if got, want := jsonOf(r.Find("NetworkPolicy", "planex-supervisor")), jsonOf(plain.Find("NetworkPolicy", "planex-supervisor")); !tc.console && !tc.insecure && got != want {
				t.Errorf("NetworkPolicy planex-supervisor changed by the webhook:\n  got  %s\n  want %s", got, want)
			}
			for _, f := range []Flow{
				{PeerStranger, endpoint(t, r, "planex-supervisor"), Port{corev1.ProtocolTCP, 7400}},
				{PeerInternet4, endpoint(t, r, "planex-supervisor"), Port{corev1.ProtocolTCP, 7400}},
				{PeerMetadata, endpoint(t, r, "planex-supervisor"), webhookPort},
				{PeerIngressController, endpoint(t, r, "planex-planner"), webhookPort},
			} {
				if r.Allowed(f) {
					t.Errorf("flow %s allowed", f)
				}
			}
			if !r.Allowed(Flow{PeerIngressController, endpoint(t, r, "planex-supervisor"), webhookPort}) {
				t.Error("the ingress controller cannot reach the webhook port")
			}
			if got := r.Allowed(Flow{PeerInternet4, endpoint(t, r, "planex-supervisor"), webhookPort}); got != tc.open {
				t.Errorf("internet -> webhook port allowed %v, want %v", got, tc.open)
			}

			// cert-manager: the supervisor's certificate names the webhook Service.
			if c, _ := r.Find("Certificate", "planex-tls-supervisor").(*Certificate); c != nil && !slices.Contains(c.Spec.DNSNames, "planex-supervisor-webhook.agents.svc") {
				t.Errorf("Certificate planex-tls-supervisor DNS names %v lack planex-supervisor-webhook", c.Spec.DNSNames)
			}
		})
	}
}

// checkWebhookIngress checks the Ingress of webhookValues: its class, TLS
// and annotations, and one rule routing the path prefix /v1/hooks/ of
// hooks.example.com to the webhook Service's port, nothing else.
func checkWebhookIngress(t *testing.T, ing *networkingv1.Ingress) {
	t.Helper()
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" || ing.Spec.DefaultBackend != nil {
		t.Errorf("Ingress class %v default backend %v", ing.Spec.IngressClassName, ing.Spec.DefaultBackend)
	}
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "hooks-example-com-tls" || !slices.Equal(ing.Spec.TLS[0].Hosts, []string{"hooks.example.com"}) {
		t.Errorf("Ingress TLS %s", jsonOf(ing.Spec.TLS))
	}
	if ing.Annotations["nginx.ingress.kubernetes.io/backend-protocol"] != "HTTPS" {
		t.Errorf("Ingress annotations %v", ing.Annotations)
	}
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != "hooks.example.com" || ing.Spec.Rules[0].HTTP == nil {
		t.Fatalf("Ingress rules %s: want one for hooks.example.com", jsonOf(ing.Spec.Rules))
	}
	paths := ing.Spec.Rules[0].HTTP.Paths
	if len(paths) != 1 {
		t.Fatalf("Ingress paths %s: want /v1/hooks/ alone", jsonOf(paths))
	}
	p := paths[0]
	if p.Path != "/v1/hooks/" || p.PathType == nil || *p.PathType != networkingv1.PathTypePrefix {
		t.Errorf("Ingress path %q type %v, want Prefix /v1/hooks/", p.Path, p.PathType)
	}
	if b := p.Backend.Service; b == nil || b.Name != "planex-supervisor-webhook" || b.Port.Name != "webhook" {
		t.Errorf("Ingress backend %s, want Service planex-supervisor-webhook port webhook", jsonOf(p.Backend))
	}
}

// selectsSet reports whether a Service selector selects labels l.
func selectsSet(selector, l map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if l[k] != v {
			return false
		}
	}
	return true
}

// endpoint returns the render's endpoint of the workload whose pods are
// app.kubernetes.io/name name, or fails.
func endpoint(t *testing.T, r Render, name string) Endpoint {
	t.Helper()
	for _, e := range r.Endpoints() {
		if !e.external() && e.Namespace == r.Namespace && e.Labels["app.kubernetes.io/name"] == name {
			return e
		}
	}
	t.Fatalf("no endpoint %s in the render", name)
	return Endpoint{}
}

// TestHelmWebhookDisabled renders the default values and CI values files
// without webhooks: nothing of them is rendered (no flag, port, volume,
// Service, Ingress, NetworkPolicy or certificate name; the word does not
// appear in the manifests).
func TestHelmWebhookDisabled(t *testing.T) {
	for _, files := range [][]string{nil, {"ci/values-full.yaml"}, {"ci/values-cert-manager.yaml"}, {"ci/values-insecure.yaml"}} {
		t.Run(strings.Join(append([]string{"default"}, files...), "+"), func(t *testing.T) {
			o := HelmOptions{Namespace: "agents", ValueFiles: slices.Clone(files)}
			for i, f := range o.ValueFiles {
				o.ValueFiles[i] = chartDir(t) + "/" + f
			}
			out, err := HelmRender(chartDir(t), o)
			if err != nil {
				t.Fatal(err)
			}
			if i := strings.Index(strings.ToLower(string(out)), "webhook"); i >= 0 {
				t.Errorf("webhooks are off, but the manifests say %q", string(out[max(0, i-200):min(len(out), i+100)]))
			}
			r := decode(t, "default", out, "agents", false)
			if slices.ContainsFunc(r.Objects, func(o Object) bool { return o.Kind == "Ingress" }) {
				t.Error("an Ingress without webhooks")
			}
			_, c := supervisorContainer(t, r)
			env := r.env(c)
			for _, k := range []string{"PLANEX_WEBHOOK_ADDR", "PLANEX_WEBHOOK_SECRETS_DIR"} {
				if _, ok := env[k]; ok {
					t.Errorf("supervisor %s set without webhooks", k)
				}
			}
			if len(c.Ports) != 3 {
				t.Errorf("supervisor ports %s: want grpc, metrics, health", jsonOf(c.Ports))
			}
		})
	}
}

// TestHelmWebhookRejects: webhooks on without their Secret, an Ingress
// without a host, and a port the supervisor already uses each stop the
// render with an error naming the value.
func TestHelmWebhookRejects(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		want string
	}{
		{"no secrets Secret", []string{"supervisor.webhook.secretsSecret="}, "/supervisor/webhook"},
		{"ingress without host", []string{"supervisor.webhook.ingress.host="}, "/supervisor/webhook/ingress"},
		{"gRPC port", []string{"supervisor.webhook.port=7400"}, "/supervisor/webhook/port"},
		{"health port", []string{"supervisor.webhook.port=7410"}, "/supervisor/webhook/port"},
		{"port a string", []string{"supervisor.webhook.port=hooks"}, "/supervisor/webhook/port"},
		{"misspelt key", []string{"supervisor.webhook.secretSecret=x"}, "secretSecret"},
		{"service type", []string{"supervisor.webhook.service.type=ExternalName"}, "/supervisor/webhook/service/type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tryRenderChart(t, HelmOptions{ValueFiles: []string{webhookValues}, Set: tc.set})
			if err == nil {
				t.Fatalf("--set %v rendered", tc.set)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not name %q: %v", tc.want, err)
			}
		})
	}
	// The default values with webhooks switched on: the Secret is missing.
	_, err := tryRenderChart(t, HelmOptions{Set: []string{"supervisor.webhook.enabled=true"}})
	if err == nil || !strings.Contains(err.Error(), "secretsSecret") {
		t.Errorf("webhooks without a Secret: %v", err)
	}
}

// chartNotes renders the chart's NOTES.txt for release planex in
// namespace agents with the values files (relative to the chart).
func chartNotes(t *testing.T, files ...string) string {
	t.Helper()
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	var abs []string
	for _, f := range files {
		abs = append(abs, filepath.Join(chartDir(t), f))
	}
	vals, err := (&values.Options{ValueFiles: abs}).MergeValues(getter.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.ReleaseName, install.Namespace = true, true, "planex", "agents"
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}
	rel, err := install.Run(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	return rel.Info.Notes
}

// TestHelmWebhookNotes: with webhooks on, NOTES.txt names their public
// URL (the Ingress host), the in-cluster URL and the Secret to create;
// without, it says nothing of them.
func TestHelmWebhookNotes(t *testing.T) {
	notes := chartNotes(t, webhookValues)
	for _, want := range []string{
		"https://hooks.example.com/v1/hooks/<tenant>/<trigger>",
		"https://planex-supervisor-webhook.agents.svc:7481/v1/hooks/<tenant>/<trigger>",
		"planex-webhook-secrets (one key per trigger's webhook.secret_ref)",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, notes)
		}
	}
	if notes := chartNotes(t); strings.Contains(strings.ToLower(notes), "webhook") {
		t.Errorf("webhooks are off, but NOTES.txt names them:\n%s", notes)
	}
}

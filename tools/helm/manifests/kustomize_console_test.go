package manifests

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// consoleCombinations are the overlays with components/console: alone,
// with its Certificate next to components/cert-manager (in both orders),
// and with every other component, in another namespace too.
func consoleCombinations() []Combination {
	var cs []Combination
	others := map[string][]string{
		"dev":        {"keda", "search-pvc", "prometheus-operator", "cert-manager", "policy", "mcp-pool", "mcp-pool/cert-manager"},
		"production": {"keda", "prometheus-operator", "cert-manager", "policy", "mcp-pool", "mcp-pool/cert-manager"},
	}
	for _, o := range []string{"dev", "production"} {
		all := append(slices.Clone(others[o]), "console", "console/cert-manager")
		rev := slices.Clone(all)
		slices.Reverse(rev)
		cs = append(cs,
			Combination{Overlay: o, Components: []string{"console"}},
			Combination{Overlay: o, Components: []string{"cert-manager", "console", "console/cert-manager"}},
			Combination{Overlay: o, Components: []string{"console/cert-manager", "console", "cert-manager"}},
			Combination{Overlay: o, Components: []string{"console"}, Namespace: "acme-agents"},
			Combination{Overlay: o, Components: all},
			Combination{Overlay: o, Components: rev, Namespace: "acme-agents"},
		)
	}
	return cs
}

// consoleNeeds is what a render with the console (and maybe the mcp pool)
// needs.
func consoleNeeds(r Render, f Flow) bool { return ConsoleFlows(r, f) || mcpFlows(r, f) }

// consoleErrors runs every check on a render holding components/console,
// with the console's flows added to the needed ones (the ingress
// controller as a peer, the console's port probed), and checks the
// console itself: HTTPS from its own Secret, the supervisor verified
// against the planex CA from that Secret, no credential and no plaintext,
// probes that pass its Host check, hardened container.
func consoleErrors(r Render) []error {
	var errs []error
	for _, c := range []func() []error{
		r.CheckPodSecurity, r.CheckLabels, r.CheckSelectors, r.CheckPorts, r.CheckImages,
		r.CheckSecrets, r.CheckReferences, r.CheckAutoscaling, r.CheckProbeBudget,
		r.CheckZeroTrust, r.CheckCertificates,
	} {
		errs = append(errs, c()...)
	}
	errs = append(errs, r.CheckNetworkPoliciesWith(consoleNeeds, []Endpoint{PeerIngressController}, []Port{ConsolePort})...)

	d, ok := r.Find("Deployment", "planex-console").(*appsv1.Deployment)
	if !ok {
		return append(errs, fmt.Errorf("%s: no Deployment planex-console", r.Name))
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return append(errs, fmt.Errorf("planex-console: %d containers, want 1", len(spec.Containers)))
	}
	c := spec.Containers[0]
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf("planex-console: "+format, a...)) }
	if len(c.Args) == 0 || c.Args[0] != "console" {
		fail("args %v: want the console subcommand", c.Args)
	}
	env := r.env(c)
	for _, a := range c.Args[min(1, len(c.Args)):] {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if value == "" {
			value = "true"
		}
		env["PLANEX_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))] = value
	}
	if strings.EqualFold(env["PLANEX_PLAINTEXT"], "true") {
		fail("--plaintext: the console must reach the supervisor over TLS (tokens are forwarded only then)")
	}
	for k := range env {
		if sensitive.MatchString(k) || strings.Contains(k, "TOKEN") || strings.HasPrefix(k, "<envFrom Secret") {
			fail("%s: the console holds no credential of its own (it would authenticate every browser as the console)", k)
		}
	}
	// The supervisor's Service and API port.
	host, port, _ := strings.Cut(env["PLANEX_ADDR"], ":")
	svc, _ := r.Find("Service", host).(*corev1.Service)
	if host != "planex-supervisor" || svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return fmt.Sprint(p.Port) == port && port == "7400" }) {
		fail("PLANEX_ADDR %q: want the supervisor's Service planex-supervisor:7400", env["PLANEX_ADDR"])
	}
	for _, k := range []string{"PLANEX_HTTP_TLS_CERT_FILE", "PLANEX_HTTP_TLS_KEY_FILE", "PLANEX_TLS_CA_FILE"} {
		if s := secretMount(spec, c, env[k]); s != "planex-tls-console" {
			fail("%s=%q is on Secret %q, want planex-tls-console", k, env[k], s)
		}
	}
	// HTTPS on the pod address, on the port the Service and the policy name.
	if _, p, _ := strings.Cut(env["PLANEX_HTTP_ADDR"], ":"); p != fmt.Sprint(ConsolePort.Number) || !containerPort(c, intstr.FromInt32(ConsolePort.Number)) {
		fail("PLANEX_HTTP_ADDR %q: want :%d, a port of the container", env["PLANEX_HTTP_ADDR"], ConsolePort.Number)
	}
	if svc, _ := r.Find("Service", "planex-console").(*corev1.Service); svc == nil {
		fail("no Service planex-console")
	}
	// Probes: HTTPS with a Host the console answers (the pod IP is refused).
	for kind, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		switch {
		case p == nil || p.HTTPGet == nil:
			fail("%s: want an HTTPS GET", kind)
		case p.HTTPGet.Scheme != corev1.URISchemeHTTPS:
			fail("%s: scheme %q, want HTTPS (the console serves TLS only)", kind, p.HTTPGet.Scheme)
		case !slices.Contains(p.HTTPGet.HTTPHeaders, corev1.HTTPHeader{Name: "Host", Value: "localhost"}):
			fail("%s: no Host: localhost header; the console refuses the pod IP as Host (403)", kind)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		fail("root filesystem not read-only")
	}
	if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		fail("resources: want requests and limits")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		fail("automountServiceAccountToken: want false")
	}
	// Not a planex service (no NATS), not a generic client of the supervisor.
	for _, l := range []string{"planex.dev/service", "planex.dev/client"} {
		if _, ok := d.Spec.Template.Labels[l]; ok {
			fail("pod label %s: the console's NetworkPolicies name it; this label would open more", l)
		}
	}
	if cert, ok := r.Find("Certificate", "planex-tls-console").(*Certificate); ok && slices.Contains(cert.Spec.Usages, "client auth") {
		errs = append(errs, fmt.Errorf("Certificate planex-tls-console: usage client auth; the console presents no client certificate"))
	}
	return errs
}

func TestKustomizeConsole(t *testing.T) {
	k := k8sFS(t)
	policies := map[string]string{} // the supervisor's policies by overlay and namespace, without the console
	supervisorPolicies := func(r Render) string {
		var ps []string
		for _, o := range r.Objects {
			np, ok := o.Obj.(*networkingv1.NetworkPolicy)
			if !ok || !selects(&np.Spec.PodSelector, map[string]string{"app.kubernetes.io/name": "planex-supervisor"}) || o.Name == "planex-supervisor-from-console" {
				continue
			}
			b, _ := json.Marshal(np.Spec)
			ps = append(ps, o.Name+" "+string(b))
		}
		slices.Sort(ps)
		return strings.Join(ps, "\n")
	}
	for _, c := range consoleCombinations() {
		t.Run(c.Name(), func(t *testing.T) {
			ns := "planex"
			if c.Namespace != "" {
				ns = c.Namespace
			}
			out, err := k.BuildCombination(c)
			if err != nil {
				t.Fatal(err)
			}
			// Read without a default namespace: everything the component
			// adds must carry the overlay's namespace itself.
			raw, err := Decode(out, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range raw {
				if o.Kind != "Namespace" && o.Namespace != ns {
					t.Errorf("%s: namespace %q, want %q", o.ID(), o.Namespace, ns)
				}
			}
			r := decode(t, c.Name(), out, ns, c.Overlay == "dev")
			if errs := consoleErrors(r); len(errs) > 0 {
				t.Errorf("%d problems:%s", len(errs), describe(errs))
			}
			// The supervisor's own policies are those of the same render
			// without the console: the console adds a policy, widens none.
			without := c
			without.Components = slices.DeleteFunc(slices.Clone(c.Components), func(s string) bool { return strings.HasPrefix(s, "console") })
			key := without.Name()
			if _, ok := policies[key]; !ok {
				wout, err := k.BuildCombination(without)
				if err != nil {
					t.Fatal(err)
				}
				wr := decode(t, key, wout, ns, c.Overlay == "dev")
				if wr.Find("NetworkPolicy", "planex-supervisor-from-console") != nil || wr.Find("Deployment", "planex-console") != nil {
					t.Fatalf("%s: console objects without components/console", key)
				}
				policies[key] = supervisorPolicies(wr)
			}
			if got := supervisorPolicies(r); got != policies[key] {
				t.Errorf("the supervisor's policies change with the console:\n  with    %s\n  without %s", got, policies[key])
			}
		})
	}
}

// TestKustomizeConsoleAllowedHosts renders the patch of
// components/console/kustomization.yaml that names the ingress host, in
// the kustomization that lists the component.
func TestKustomizeConsoleAllowedHosts(t *testing.T) {
	k := k8sFS(t)
	kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../overlays/production
components:
  - ../../components/console
patches:
  - target: {kind: Deployment, name: planex-console}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {name: PLANEX_ALLOWED_HOSTS, value: planex.example.com}
`
	if err := k.Write("user/console-hosts/kustomization.yaml", kust); err != nil {
		t.Fatal(err)
	}
	out, err := k.Build("user/console-hosts")
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "console-hosts", out, "planex", false)
	if errs := consoleErrors(r); len(errs) > 0 {
		t.Errorf("%d problems:%s", len(errs), describe(errs))
	}
	d := r.Find("Deployment", "planex-console").(*appsv1.Deployment)
	if got := r.env(d.Spec.Template.Spec.Containers[0])["PLANEX_ALLOWED_HOSTS"]; got != "planex.example.com" {
		t.Errorf("PLANEX_ALLOWED_HOSTS %q after the documented patch", got)
	}
}

// TestKustomizeConsoleBrokenFails proves the console checks catch what they
// claim: each case breaks the console in one way and must be named.
func TestKustomizeConsoleBrokenFails(t *testing.T) {
	k := k8sFS(t)
	cases := []struct {
		name, target, patch, want string
		components                []string
	}{
		{"ingress from every namespace", "kind: NetworkPolicy, name: planex-console", `
- op: replace
  path: /spec/ingress/0/from/0/namespaceSelector
  value: {}`, "apps/stranger -> planex/planex-console TCP/7480 is allowed but not needed", nil},
		{"egress anywhere", "kind: NetworkPolicy, name: planex-console", `
- op: remove
  path: /spec/egress/0/to`, "flow planex/planex-console -> apps/client TCP/7400 is allowed but not needed", nil},
		{"supervisor not admitting it", "kind: NetworkPolicy, name: planex-supervisor-from-console", `
- op: replace
  path: /spec/ingress/0/ports/0/port
  value: 7401`, "needed flow planex/planex-console -> planex/planex-supervisor TCP/7400 is denied", nil},
		{"certificate not from its Secret", "kind: Deployment, name: planex-console", `
- op: replace
  path: /spec/template/spec/containers/0/env/3/value
  value: /tmp/tls.crt`, `PLANEX_HTTP_TLS_CERT_FILE="/tmp/tls.crt" is on Secret "", want planex-tls-console`, nil},
		{"plaintext to the supervisor", "kind: Deployment, name: planex-console", `
- op: add
  path: /spec/template/spec/containers/0/args/-
  value: --plaintext`, "--plaintext: the console must reach the supervisor over TLS", nil},
		{"a token of its own", "kind: Deployment, name: planex-console", `
- op: add
  path: /spec/template/spec/containers/0/env/-
  value: {name: PLANEX_TOKEN_FILE, value: /etc/planex/tls/token}`, "PLANEX_TOKEN_FILE: the console holds no credential of its own", nil},
		{"probe without Host", "kind: Deployment, name: planex-console", `
- op: remove
  path: /spec/template/spec/containers/0/readinessProbe/httpGet/httpHeaders`, "readinessProbe: no Host: localhost header", nil},
		{"writable root", "kind: Deployment, name: planex-console", `
- op: replace
  path: /spec/template/spec/containers/0/securityContext/readOnlyRootFilesystem
  value: false`, "root filesystem not read-only", nil},
		{"cert-manager without the console Certificate", "", "", "TLS Secret planex-tls-console has no cert-manager Certificate", []string{"cert-manager"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../overlays/production\ncomponents:\n  - ../../components/console\n"
			for _, c := range tc.components {
				kust += "  - ../../components/" + c + "\n"
			}
			if tc.patch != "" {
				kust += "patches:\n  - target: {" + tc.target + "}\n    patch: |-" + indent(tc.patch, "      ") + "\n"
			}
			dir := "broken-console/" + strings.ReplaceAll(tc.name, " ", "-")
			if err := k.Write(dir+"/kustomization.yaml", kust); err != nil {
				t.Fatal(err)
			}
			out, err := k.Build(dir)
			if err != nil {
				t.Fatal(err)
			}
			r := decode(t, tc.name, out, "planex", false)
			if msgs := describe(consoleErrors(r)); !strings.Contains(msgs, tc.want) {
				t.Fatalf("broken console passed the checks (want an error containing %q); got:%s", tc.want, msgs)
			}
		})
	}
}

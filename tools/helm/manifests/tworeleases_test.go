package manifests

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// renderChart renders the chart with release o.Release (default "planex")
// into o.Namespace (default "agents"); relative value files are read from
// the chart directory.
func renderChart(t testing.TB, o HelmOptions) Render {
	t.Helper()
	r, err := tryRenderChart(t, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tryRenderChart(t testing.TB, o HelmOptions) (Render, error) {
	t.Helper()
	dir := chartDir(t)
	o.ValueFiles = slices.Clone(o.ValueFiles)
	for i, f := range o.ValueFiles {
		if !filepath.IsAbs(f) {
			o.ValueFiles[i] = filepath.Join(dir, f)
		}
	}
	if o.Namespace == "" {
		o.Namespace = "agents"
	}
	out, err := HelmRender(dir, o)
	if err != nil {
		return Render{}, err
	}
	name := fmt.Sprintf("helm %s %v %v", o.Release, o.ValueFiles, o.Set)
	return decode(t, name, out, o.Namespace, false), nil
}

// legacyNames returns the render with every object named as the chart
// names it in a release called "planex" (planex.name in _helpers.tpl, run
// backwards): the flow model (NeededFlows) looks some objects up by those
// names (StatefulSet nats, NetworkPolicy planex-to-otlp). The objects
// themselves are untouched.
func legacyNames(r Render, fullname string) Render {
	out := r
	out.Objects = slices.Clone(r.Objects)
	for i, o := range out.Objects {
		switch rest, ok := strings.CutPrefix(o.Name, fullname+"-"); {
		case o.Name == fullname:
			out.Objects[i].Name = "planex"
		case ok && (strings.HasPrefix(rest, "nats") || rest == "default-deny-all" || rest == "allow-dns-egress"):
			out.Objects[i].Name = rest
		case ok:
			out.Objects[i].Name = "planex-" + rest
		}
	}
	return out
}

// sameRelease restricts a flow policy to flows within one release: two
// pods of the namespace with different app.kubernetes.io/instance labels
// need no flow between them.
func sameRelease(need FlowPolicy) FlowPolicy {
	return func(r Render, f Flow) bool {
		in := func(e Endpoint) bool { return !e.external() && e.Namespace == r.Namespace && e.Spec != nil }
		if in(f.From) && in(f.To) && f.From.Labels["app.kubernetes.io/instance"] != f.To.Labels["app.kubernetes.io/instance"] {
			return false
		}
		return need(r, f)
	}
}

// namedSelector is a label selector of an object, and what it is for.
type namedSelector struct {
	what string
	sel  labels.Selector
}

// podSelectors are every selector of a render that picks pods of its own
// namespace: workload, Service, PDB and PodMonitor selectors, the pod
// templates' affinity and spread selectors, and NetworkPolicy pod
// selectors and same-namespace peers. Skipped, because they select no
// release in particular: a NetworkPolicy that allows nothing (the default
// deny only takes away) and a peer of every namespace without a pod
// selector (egress "anywhere" on a port).
func podSelectors(t testing.TB, r Render) []namedSelector {
	t.Helper()
	var out []namedSelector
	add := func(what string, ls *metav1.LabelSelector) {
		if ls == nil {
			return
		}
		s, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out = append(out, namedSelector{what, s})
	}
	for _, w := range r.Workloads() {
		add(w.ID()+" selector", w.Selector)
		spec := w.Template.Spec
		for i, c := range spec.TopologySpreadConstraints {
			add(fmt.Sprintf("%s topologySpreadConstraints[%d]", w.ID(), i), c.LabelSelector)
		}
		if a := spec.Affinity; a != nil {
			for _, pa := range []*corev1.PodAntiAffinity{a.PodAntiAffinity} {
				if pa == nil {
					continue
				}
				for i, term := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
					add(fmt.Sprintf("%s podAntiAffinity[%d]", w.ID(), i), term.PodAffinityTerm.LabelSelector)
				}
				for i, term := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
					add(fmt.Sprintf("%s podAntiAffinity required[%d]", w.ID(), i), term.LabelSelector)
				}
			}
		}
	}
	for _, o := range r.Objects {
		switch v := o.Obj.(type) {
		case *corev1.Service:
			out = append(out, namedSelector{o.ID() + " selector", labels.SelectorFromSet(v.Spec.Selector)})
		case *policyv1.PodDisruptionBudget:
			add(o.ID()+" selector", v.Spec.Selector)
		case *PodMonitor:
			add(o.ID()+" selector", &v.Spec.Selector)
		case *networkingv1.NetworkPolicy:
			if len(v.Spec.Ingress) == 0 && len(v.Spec.Egress) == 0 {
				continue
			}
			add(o.ID()+" podSelector", &v.Spec.PodSelector)
			var peers []networkingv1.NetworkPolicyPeer
			for _, rule := range v.Spec.Ingress {
				peers = append(peers, rule.From...)
			}
			for _, rule := range v.Spec.Egress {
				peers = append(peers, rule.To...)
			}
			for i, p := range peers {
				switch {
				case p.IPBlock != nil:
				case p.NamespaceSelector != nil && p.PodSelector == nil && len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0:
				case p.NamespaceSelector != nil && !selects(p.NamespaceSelector, nsLabels(r.Namespace)):
				case p.PodSelector == nil:
					out = append(out, namedSelector{fmt.Sprintf("%s peer %d (every pod of the namespace)", o.ID(), i), labels.Everything()})
				default:
					add(fmt.Sprintf("%s peer %d", o.ID(), i), p.PodSelector)
				}
			}
		}
	}
	return out
}

// TestHelmTwoReleases installs two releases ("a" and "b") of the chart into
// one namespace, for the default values, everything on (KEDA, Prometheus
// Operator, a search PVC, cert-manager, the mcp pool) and the platform
// team's values (external NATS, console): no two objects share a kind and
// name, no selector of one release picks the other's pods, every in-cluster
// address and identity Secret is the release's own, each release passes
// every check, and the NetworkPolicies of both together allow exactly the
// flows within each release.
func TestHelmTwoReleases(t *testing.T) {
	const ns = "shared"
	cases := []struct {
		name  string
		files []string
		set   []string
	}{
		{"default", nil, nil},
		{"everything", []string{"ci/values-full.yaml", "ci/values-cert-manager.yaml", "ci/values-mcp.yaml"}, nil},
		// One release creates the namespace at most; both labelling it is
		// a clash by design.
		{"teams", []string{"ci/values-teams.yaml"}, []string{"namespace.create=false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rels := map[string]Render{}
			for _, rel := range []string{"a", "b"} {
				rels[rel] = renderChart(t, HelmOptions{Release: rel, Namespace: ns, ValueFiles: tc.files, Set: tc.set})
			}
			a, b := rels["a"], rels["b"]

			seen := map[string]string{}
			for rel, r := range rels {
				for _, o := range r.Objects {
					if prev, ok := seen[o.ID()]; ok {
						t.Errorf("%s: rendered by release %s and release %s", o.ID(), prev, rel)
					}
					seen[o.ID()] = rel
				}
			}

			for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
				own, other := rels[pair[0]], rels[pair[1]]
				for _, s := range podSelectors(t, own) {
					for _, w := range other.Workloads() {
						if s.sel.Matches(labels.Set(w.Template.Labels)) {
							t.Errorf("release %s: %s (%s) selects pods of release %s's %s", pair[0], s.what, s.sel, pair[1], w.ID())
						}
					}
				}
				checkOwnReferences(t, pair[0], own)
				for _, o := range own.Objects {
					switch v := o.Obj.(type) {
					case *autoscalingv2.HorizontalPodAutoscaler:
						if own.Find("Deployment", v.Spec.ScaleTargetRef.Name) == nil {
							t.Errorf("release %s: %s scales %s, not a Deployment of the release", pair[0], o.ID(), v.Spec.ScaleTargetRef.Name)
						}
					case *ScaledObject:
						if own.Find("Deployment", v.Spec.ScaleTargetRef.Name) == nil {
							t.Errorf("release %s: %s scales %s, not a Deployment of the release", pair[0], o.ID(), v.Spec.ScaleTargetRef.Name)
						}
					}
				}
			}

			ida, idb := identitySecrets(a), identitySecrets(b)
			for s := range ida {
				if idb[s] {
					t.Errorf("both releases mount identity Secret %s (TLS, NATS or step keys must be per release)", s)
				}
			}

			for rel, r := range rels {
				if errs := r.CheckButNetworkPolicies(); len(errs) > 0 {
					t.Errorf("release %s: %d problems:%s", rel, len(errs), describe(errs))
				}
			}
			both := Render{Name: "a+b", Namespace: ns, Objects: slices.Concat(legacyNames(a, "a-planex").Objects, legacyNames(b, "b-planex").Objects)}
			if errs := both.CheckNetworkPoliciesWith(sameRelease(func(r Render, f Flow) bool { return ConsoleFlows(r, f) || mcpFlows(r, f) }), []Endpoint{PeerIngressController}, []Port{ConsolePort}); len(errs) > 0 {
				t.Errorf("both releases' NetworkPolicies: %d problems:%s", len(errs), describe(errs))
			}
		})
	}
}

// natsRoute is a cluster route of nats.conf: host (pod.service) and port.
var natsRoute = regexp.MustCompile(`(?:nats|tls)://([^:/\s]+):6222`)

// checkOwnReferences checks that the in-cluster addresses a release's pods
// use (NATS URL, planner address, the console's supervisor, the NATS
// cluster routes) name Services and pods of the release.
func checkOwnReferences(t *testing.T, rel string, r Render) {
	t.Helper()
	for _, w := range r.Workloads() {
		sts, ok := w.Obj.(*appsv1.StatefulSet)
		if !ok || w.Template.Labels["app.kubernetes.io/name"] != "nats" {
			continue
		}
		var conf string
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				if cm, ok := r.Find("ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap); ok {
					conf += cm.Data["nats.conf"]
				}
			}
		}
		routes := natsRoute.FindAllStringSubmatch(conf, -1)
		if sts.Spec.Replicas != nil && *sts.Spec.Replicas > 1 && len(routes) != int(*sts.Spec.Replicas) {
			t.Errorf("release %s: %s: nats.conf has %d routes, want %d", rel, w.ID(), len(routes), *sts.Spec.Replicas)
		}
		for i, m := range routes {
			if want := fmt.Sprintf("%s-%d.%s", w.Name, i, sts.Spec.ServiceName); m[1] != want {
				t.Errorf("release %s: %s: route %d to %s, want %s (the release's own pods)", rel, w.ID(), i, m[1], want)
			}
		}
	}
	hostOf := func(addr string) string {
		if u, err := url.Parse(addr); err == nil && u.Host != "" {
			addr = u.Host
		}
		if h, _, err := net.SplitHostPort(addr); err == nil {
			addr = h
		}
		return strings.Split(addr, ".")[0]
	}
	bundled := slices.ContainsFunc(r.Workloads(), func(w Workload) bool { return w.Template.Labels["app.kubernetes.io/name"] == "nats" })
	for _, w := range r.Workloads() {
		for _, c := range w.Template.Spec.Containers {
			env := r.env(c)
			var refs []string
			if v := env["PLANEX_NATS_URL"]; v != "" && bundled {
				refs = append(refs, v)
			}
			if v := env["PLANEX_PLANNER_ADDR"]; v != "" {
				refs = append(refs, v)
			}
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--addr="); ok {
					refs = append(refs, v)
				}
			}
			for _, ref := range refs {
				if h := hostOf(ref); r.Find("Service", h) == nil {
					t.Errorf("release %s: %s container %s uses %s: Service %s is not the release's", rel, w.ID(), c.Name, ref, h)
				}
			}
		}
	}
}

// identitySecrets are the Secrets holding a release's identities: the
// services' TLS certificates, their NATS nkeys (not an external NATS'
// credentials, which the values name), the step keys and the bundled NATS'
// certificate and authorization.
func identitySecrets(r Render) map[string]bool {
	out := map[string]bool{}
	for _, w := range r.Workloads() {
		for _, v := range w.Template.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			switch {
			case v.Name == "tls", v.Name == "auth", v.Name == "step-signing", v.Name == "step-verify":
				out[v.Secret.SecretName] = true
			case v.Name == "nats-creds" && len(v.Secret.Items) == 0 && !strings.HasPrefix(v.Secret.SecretName, "nats-creds"):
				out[v.Secret.SecretName] = true
			}
		}
	}
	return out
}

// The legacy view maps every name of release "a" back to the names of a
// release called planex (what NeededFlows looks up).
func TestLegacyNames(t *testing.T) {
	r := renderChart(t, HelmOptions{Release: "a", ValueFiles: []string{"ci/values-full.yaml"}})
	planex := renderChart(t, HelmOptions{ValueFiles: []string{"ci/values-full.yaml"}})
	ids := func(r Render) []string {
		var out []string
		for _, o := range r.Objects {
			out = append(out, o.Kind+"/"+o.Name)
		}
		slices.Sort(out)
		return out
	}
	if got, want := ids(legacyNames(r, "a-planex")), ids(planex); !slices.Equal(got, want) {
		t.Errorf("legacy names of release a:\n  %v\nrelease planex:\n  %v", got, want)
	}
	if _, ok := r.Find("StatefulSet", "a-planex-nats").(*appsv1.StatefulSet); !ok {
		t.Error("release a: no StatefulSet a-planex-nats")
	}
}

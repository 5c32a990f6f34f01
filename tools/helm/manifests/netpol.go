package manifests

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Endpoint is one side of a flow: a pod of the render, a pod of another
// namespace, or an address outside the cluster.
type Endpoint struct {
	// Name identifies the endpoint in messages (workload name or role).
	Name      string
	Namespace string
	Labels    map[string]string
	// IP is set for addresses outside the cluster.
	IP netip.Addr
	// Spec is the pod spec of the render's pods (for named ports).
	Spec *corev1.PodSpec
}

func (e Endpoint) external() bool { return e.IP.IsValid() }

func (e Endpoint) String() string {
	if e.external() {
		return e.Name + "(" + e.IP.String() + ")"
	}
	return e.Namespace + "/" + e.Name
}

// Port is a protocol and number.
type Port struct {
	Protocol corev1.Protocol
	Number   int32
}

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Number) }

// probePorts are the ports flows are evaluated on: every port a planex
// component or a peer listens on, and the ones egress rules name.
var probePorts = func() []Port {
	ps := []Port{{corev1.ProtocolUDP, 53}}
	for _, n := range []int32{25, 53, 80, 443, 465, 587, 1025, 4222, 4317, 4318, 5432, 6222, 7400, 7401, 7402, 7777, 8000, 8025, 8222, 9090, 11434, 13133, 16686} {
		ps = append(ps, Port{corev1.ProtocolTCP, n})
	}
	return ps
}()

// Peers outside the render: who talks to planex, or whom planex talks to.
var (
	PeerDNS        = Endpoint{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}}
	PeerPrometheus = Endpoint{Name: "prometheus", Namespace: "monitoring", Labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}
	PeerCollector  = Endpoint{Name: "otel-collector", Namespace: "observability", Labels: map[string]string{"app.kubernetes.io/name": "otel-collector"}}
	PeerKEDA       = Endpoint{Name: "keda-operator", Namespace: "keda", Labels: map[string]string{"app": "keda-operator"}}
	PeerClient     = Endpoint{Name: "client", Namespace: "apps", Labels: map[string]string{"planex.dev/client": "true"}}
	PeerStranger   = Endpoint{Name: "stranger", Namespace: "apps", Labels: map[string]string{"app": "other"}}
	PeerLLM        = Endpoint{Name: "vllm", Namespace: "llm", Labels: map[string]string{"app": "vllm"}}
	PeerInternet4  = Endpoint{Name: "internet", IP: netip.MustParseAddr("203.0.113.10")}
	PeerInternet6  = Endpoint{Name: "internet6", IP: netip.MustParseAddr("2001:db8::10")}
	PeerMetadata   = Endpoint{Name: "cloud-metadata", IP: netip.MustParseAddr("169.254.169.254")}
	PeerMetadata6  = Endpoint{Name: "link-local6", IP: netip.MustParseAddr("fe80::1")}
)

var peers = []Endpoint{PeerDNS, PeerPrometheus, PeerCollector, PeerKEDA, PeerClient, PeerStranger, PeerLLM, PeerInternet4, PeerInternet6, PeerMetadata, PeerMetadata6}

// Flow is a connection attempt.
type Flow struct {
	From, To Endpoint
	Port     Port
}

func (f Flow) String() string { return fmt.Sprintf("%s -> %s %s", f.From, f.To, f.Port) }

// Endpoints are the render's pods (one per workload) and the peers.
func (r Render) Endpoints() []Endpoint {
	var es []Endpoint
	for _, w := range r.Workloads() {
		es = append(es, Endpoint{Name: w.Name, Namespace: w.Namespace, Labels: w.Template.Labels, Spec: &w.Template.Spec})
	}
	return append(es, peers...)
}

func (r Render) policies() []*networkingv1.NetworkPolicy {
	var ps []*networkingv1.NetworkPolicy
	for _, o := range r.Objects {
		if np, ok := o.Obj.(*networkingv1.NetworkPolicy); ok {
			if np.Namespace == "" {
				np.Namespace = o.Namespace
			}
			ps = append(ps, np)
		}
	}
	return ps
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

func nsLabels(ns string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": ns}
}

// peerMatches reports whether a NetworkPolicyPeer of a policy in
// namespace ns matches e.
func peerMatches(p networkingv1.NetworkPolicyPeer, ns string, e Endpoint) bool {
	if p.IPBlock != nil {
		if !e.external() {
			return false // pod IPs are not modelled by ipBlock
		}
		cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
		if err != nil || !cidr.Contains(e.IP) {
			return false
		}
		for _, ex := range p.IPBlock.Except {
			if exp, err := netip.ParsePrefix(ex); err == nil && exp.Contains(e.IP) {
				return false
			}
		}
		return true
	}
	if e.external() {
		return false
	}
	if p.NamespaceSelector == nil {
		if e.Namespace != ns {
			return false
		}
	} else if !selects(p.NamespaceSelector, nsLabels(e.Namespace)) {
		return false
	}
	return p.PodSelector == nil || selects(p.PodSelector, e.Labels)
}

// portMatches reports whether a rule's ports admit p on the destination
// dst (named ports resolve against dst's containers).
func portMatches(ports []networkingv1.NetworkPolicyPort, p Port, dst Endpoint) bool {
	if len(ports) == 0 {
		return true
	}
	for _, np := range ports {
		proto := corev1.ProtocolTCP
		if np.Protocol != nil {
			proto = *np.Protocol
		}
		if proto != p.Protocol {
			continue
		}
		if np.Port == nil {
			return true
		}
		if np.Port.Type == intstr.Int {
			end := np.Port.IntVal
			if np.EndPort != nil {
				end = *np.EndPort
			}
			if p.Number >= np.Port.IntVal && p.Number <= end {
				return true
			}
			continue
		}
		if dst.Spec != nil {
			for _, c := range dst.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == np.Port.StrVal && cp.ContainerPort == p.Number {
						return true
					}
				}
			}
		}
	}
	return false
}

// Allowed evaluates a flow against the render's NetworkPolicies, as a CNI
// that enforces them would. Endpoints outside the render's namespace are
// not restricted by these policies.
func (r Render) Allowed(f Flow) bool {
	pols := r.policies()
	egressOK := func() bool {
		if f.From.external() || f.From.Namespace != r.Namespace {
			return true
		}
		selected := false
		for _, np := range pols {
			if np.Namespace != f.From.Namespace || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !selects(&np.Spec.PodSelector, f.From.Labels) {
				continue
			}
			selected = true
			for _, rule := range np.Spec.Egress {
				if !portMatches(rule.Ports, f.Port, f.To) {
					continue
				}
				if len(rule.To) == 0 || slices.ContainsFunc(rule.To, func(p networkingv1.NetworkPolicyPeer) bool { return peerMatches(p, np.Namespace, f.To) }) {
					return true
				}
			}
		}
		return !selected
	}
	ingressOK := func() bool {
		if f.To.external() || f.To.Namespace != r.Namespace {
			return true
		}
		selected := false
		for _, np := range pols {
			if np.Namespace != f.To.Namespace || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !selects(&np.Spec.PodSelector, f.To.Labels) {
				continue
			}
			selected = true
			for _, rule := range np.Spec.Ingress {
				if !portMatches(rule.Ports, f.Port, f.To) {
					continue
				}
				if len(rule.From) == 0 || slices.ContainsFunc(rule.From, func(p networkingv1.NetworkPolicyPeer) bool { return peerMatches(p, np.Namespace, f.From) }) {
					return true
				}
			}
		}
		return !selected
	}
	return egressOK() && ingressOK()
}

// FlowPolicy says which flows planex needs.
type FlowPolicy func(r Render, f Flow) bool

// NeededFlows is what planex needs, and all it may have: DNS for every pod;
// every planex service to NATS, the trace collector (or the dev Jaeger);
// clients to the supervisor, the supervisor to the planner; the planner to
// LLM APIs (443) and in-cluster model servers (8000, 11434); the email pool
// to SMTP relays (25, 465, 587; Mailpit in dev); the sql pool to PostgreSQL;
// NATS routes between NATS pods; Prometheus to the metrics ports; KEDA to
// the NATS monitoring port. "Outside" means any address but link-local, or
// a pod of another namespace.
func NeededFlows(r Render, f Flow) bool {
	in := func(e Endpoint) bool { return !e.external() && e.Namespace == r.Namespace }
	name := func(e Endpoint) string {
		if !in(e) {
			return ""
		}
		// A tenant's pool (labels planex.dev/tenant and planex.dev/pool,
		// docs/tenancy.md) needs what its pool needs.
		if p := e.Labels["planex.dev/pool"]; p != "" && e.Labels["planex.dev/tenant"] != "" && e.Labels["app.kubernetes.io/component"] == "executor" {
			return "planex-executor-" + p
		}
		return e.Labels["app.kubernetes.io/name"]
	}
	planex := func(e Endpoint) bool { return in(e) && e.Labels["planex.dev/service"] == "true" }
	outside := func(e Endpoint) bool {
		if e.external() {
			return !e.IP.IsLinkLocalUnicast()
		}
		return e.Namespace != r.Namespace
	}
	is := func(e, peer Endpoint) bool {
		return !in(e) && e.Name == peer.Name && e.Namespace == peer.Namespace && e.IP == peer.IP
	}
	tcp := func(ns ...int32) bool {
		return f.Port.Protocol == corev1.ProtocolTCP && slices.Contains(ns, f.Port.Number)
	}
	natsBundled := r.Find("StatefulSet", "nats") != nil
	src, dst := f.From, f.To
	switch {
	case in(src) && is(dst, PeerDNS) && f.Port.Number == 53:
		return true
	case planex(src) && name(dst) == "nats" && tcp(4222):
		return true
	case !natsBundled && planex(src) && dst.external() && outside(dst) && tcp(4222):
		return true
	case name(src) == "nats" && name(dst) == "nats" && tcp(6222):
		return true
	case is(src, PeerPrometheus) && name(dst) == "nats" && tcp(8222, 7777):
		return true
	case is(src, PeerPrometheus) && planex(dst) && tcp(9090):
		return true
	case is(src, PeerKEDA) && name(dst) == "nats" && tcp(8222):
		return r.hasKEDA()
	case is(src, PeerClient) && name(dst) == "planex-supervisor" && tcp(7400):
		return true
	case name(src) == "planex-supervisor" && name(dst) == "planex-planner" && tcp(7401):
		return true
	case name(src) == "planex-planner" && outside(dst) && tcp(443, 8000, 11434):
		return true
	case name(src) == "planex-executor-email" && outside(dst) && tcp(25, 465, 587):
		return true
	case name(src) == "planex-executor-email" && name(dst) == "mailpit" && tcp(1025):
		return true
	case name(src) == "planex-executor-sql" && (outside(dst) || name(dst) == "postgres") && tcp(5432):
		return true
	case planex(src) && is(dst, PeerCollector) && tcp(4317, 4318):
		return r.Find("NetworkPolicy", "planex-to-otlp") != nil
	case planex(src) && name(dst) == "jaeger" && tcp(4317, 4318):
		return true
	}
	return false
}

func (r Render) hasKEDA() bool {
	for _, o := range r.Objects {
		if o.Kind == "ScaledObject" {
			return true
		}
	}
	return false
}

// CheckFlows compares every flow between the endpoints on the probe ports
// with need: a needed flow that is denied and an allowed flow that is not
// needed are both errors.
func (r Render) CheckFlows(need FlowPolicy) []error {
	return r.CheckFlowsWith(need, nil, nil)
}

// CheckFlowsWith is CheckFlows with more peers outside the render (e.g.
// PeerIngressController) and more probe ports (e.g. ConsolePort) than
// every render is checked with.
func (r Render) CheckFlowsWith(need FlowPolicy, extraPeers []Endpoint, extraPorts []Port) []error {
	var errs []error
	es := append(r.Endpoints(), extraPeers...)
	ports := append(slices.Clone(probePorts), extraPorts...)
	for _, from := range es {
		for _, to := range es {
			if (from.external() || from.Namespace != r.Namespace) && (to.external() || to.Namespace != r.Namespace) {
				continue // neither side is governed by these policies
			}
			for _, p := range ports {
				f := Flow{From: from, To: to, Port: p}
				allowed, needed := r.Allowed(f), need(r, f)
				switch {
				case needed && !allowed:
					errs = append(errs, fmt.Errorf("NetworkPolicy: needed flow %s is denied", f))
				case allowed && !needed:
					errs = append(errs, fmt.Errorf("NetworkPolicy: flow %s is allowed but not needed", f))
				}
			}
		}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errs
}

// CheckNetworkPolicies checks the flows against NeededFlows, and that
// every pod of the render is under a default-deny policy.
func (r Render) CheckNetworkPolicies() []error {
	return r.CheckNetworkPoliciesWith(NeededFlows, nil, nil)
}

// CheckNetworkPoliciesWith is CheckNetworkPolicies for a render with more
// components than NeededFlows knows: flows are checked against need, with
// the extra peers and probe ports of CheckFlowsWith.
func (r Render) CheckNetworkPoliciesWith(need FlowPolicy, extraPeers []Endpoint, extraPorts []Port) []error {
	var errs []error
	deny := false
	for _, np := range r.policies() {
		if len(np.Spec.PodSelector.MatchLabels) == 0 && len(np.Spec.PodSelector.MatchExpressions) == 0 &&
			len(np.Spec.Ingress) == 0 && len(np.Spec.Egress) == 0 && len(np.Spec.PolicyTypes) == 2 {
			deny = true
		}
	}
	if !deny {
		errs = append(errs, fmt.Errorf("NetworkPolicy: no default-deny policy in namespace %s", r.Namespace))
	}
	flows := r.CheckFlowsWith(need, extraPeers, extraPorts)
	if len(flows) > 20 {
		flows = append(flows[:20], fmt.Errorf("... and %d more flow errors", len(flows)-20))
	}
	return append(errs, flows...)
}

// The web console (deploy/k8s/components/console): browsers reach it
// through an ingress controller, on its HTTPS port.
var (
	// PeerIngressController is an ingress controller's pod in the
	// namespace components/console admits browsers' connections from.
	PeerIngressController = Endpoint{Name: "ingress-nginx-controller", Namespace: "ingress-nginx",
		Labels: map[string]string{"app.kubernetes.io/name": "ingress-nginx", "app.kubernetes.io/component": "controller"}}
	// ConsolePort is the console's HTTPS port (PLANEX_HTTP_ADDR).
	ConsolePort = Port{corev1.ProtocolTCP, 7480}
)

// ConsoleFlows is NeededFlows plus the web console's paths, and all the
// console may have: the ingress controller to the console's HTTPS port,
// the console to the supervisor's API. The console is no planex service
// (no NATS, metrics or traces); DNS it has as every pod does. Check with
// CheckFlowsWith(ConsoleFlows, []Endpoint{PeerIngressController},
// []Port{ConsolePort}).
func ConsoleFlows(r Render, f Flow) bool {
	if NeededFlows(r, f) {
		return true
	}
	name := func(e Endpoint) string {
		if !e.external() && e.Namespace == r.Namespace {
			return e.Labels["app.kubernetes.io/name"]
		}
		return ""
	}
	is := func(e, peer Endpoint) bool {
		return !e.external() && e.Namespace != r.Namespace && e.Name == peer.Name && e.Namespace == peer.Namespace
	}
	switch {
	case is(f.From, PeerIngressController) && name(f.To) == "planex-console" && f.Port == ConsolePort:
		return true
	case name(f.From) == "planex-console" && name(f.To) == "planex-supervisor" && f.Port == Port{corev1.ProtocolTCP, 7400}:
		return true
	}
	return false
}

// describe joins errors one per line for test output.
func describe(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

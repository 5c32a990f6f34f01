package manifests

import (
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// Render is one rendered set of manifests.
type Render struct {
	// Name of the render (overlay and components, or chart and values).
	Name string
	// Namespace the objects land in.
	Namespace string
	Objects   []Object
	// DevSecrets allows Secret objects with throw-away credentials (the
	// dev overlay generates them); any other render must hold none.
	DevSecrets bool
	// Insecure marks an explicit plaintext opt-out render (services with
	// PLANEX_PLAINTEXT, PLANEX_AUTH_DISABLED, PLANEX_ALLOW_UNSIGNED_STEPS);
	// any other render must wire TLS, credentials and step keys.
	Insecure bool
}

// Workload is a pod template of a Deployment, StatefulSet or Job.
type Workload struct {
	Object
	Selector *metav1.LabelSelector
	Template *corev1.PodTemplateSpec
}

// Workloads returns the pod templates of the render.
func (r Render) Workloads() []Workload {
	var ws []Workload
	for _, o := range r.Objects {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			ws = append(ws, Workload{o, v.Spec.Selector, &v.Spec.Template})
		case *appsv1.StatefulSet:
			ws = append(ws, Workload{o, v.Spec.Selector, &v.Spec.Template})
		case *batchv1.Job:
			ws = append(ws, Workload{o, v.Spec.Selector, &v.Spec.Template})
		}
	}
	return ws
}

// Find returns the object of a kind and name, or nil.
func (r Render) Find(kind, name string) any {
	for _, o := range r.Objects {
		if o.Kind == kind && o.Name == name {
			return o.Obj
		}
	}
	return nil
}

// Check runs every check and returns every problem found. A render with
// the web console (pods named planex-console) has its NetworkPolicies
// checked against ConsoleFlows, with the ingress controller as a peer and
// the console's port probed.
func (r Render) Check() []error {
	netpol := r.CheckNetworkPolicies
	if r.hasConsole() {
		netpol = func() []error {
			return r.CheckNetworkPoliciesWith(ConsoleFlows, []Endpoint{PeerIngressController}, []Port{ConsolePort})
		}
	}
	return append(r.CheckButNetworkPolicies(), netpol()...)
}

// CheckButNetworkPolicies runs every check but the NetworkPolicy flows
// (for a render whose flows are checked another way).
func (r Render) CheckButNetworkPolicies() []error {
	var errs []error
	for _, c := range []func() []error{
		r.CheckPodSecurity, r.CheckLabels, r.CheckSelectors, r.CheckPorts, r.CheckImages,
		r.CheckSecrets, r.CheckReferences, r.CheckAutoscaling, r.CheckProbeBudget,
		r.CheckZeroTrust, r.CheckCertificates,
	} {
		errs = append(errs, c()...)
	}
	return errs
}

// hasConsole reports whether the render runs the web console.
func (r Render) hasConsole() bool {
	return slices.ContainsFunc(r.Workloads(), func(w Workload) bool {
		return w.Template.Labels["app.kubernetes.io/name"] == "planex-console"
	})
}

// CheckPodSecurity evaluates every pod template against Pod Security
// "restricted" (latest version), as the admission controller would.
func (r Render) CheckPodSecurity() []error {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return []error{err}
	}
	lv := psapi.LevelVersion{Level: psapi.LevelRestricted, Version: psapi.LatestVersion()}
	var errs []error
	for _, w := range r.Workloads() {
		res := policy.AggregateCheckResults(eval.EvaluatePod(lv, &w.Template.ObjectMeta, &w.Template.Spec))
		if !res.Allowed {
			errs = append(errs, fmt.Errorf("%s: violates PodSecurity restricted: %s", w.ID(), res.ForbiddenDetail()))
		}
	}
	return errs
}

// recommendedLabels are the app.kubernetes.io labels every workload and
// its pods carry.
var recommendedLabels = []string{
	"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of",
	"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
}

// CheckLabels checks the recommended labels on workloads and pod templates.
func (r Render) CheckLabels() []error {
	var errs []error
	for _, w := range r.Workloads() {
		for _, l := range recommendedLabels {
			if w.Labels[l] == "" {
				errs = append(errs, fmt.Errorf("%s: label %s missing", w.ID(), l))
			}
			if w.Template.Labels[l] == "" {
				errs = append(errs, fmt.Errorf("%s: pod template label %s missing", w.ID(), l))
			}
		}
	}
	return errs
}

// podsMatching returns the workloads whose pods a selector in namespace ns
// selects.
func (r Render) podsMatching(ns string, sel labels.Selector) []Workload {
	var out []Workload
	for _, w := range r.Workloads() {
		if w.Namespace == ns && sel.Matches(labels.Set(w.Template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

// CheckSelectors checks that every workload selects its own pods and that
// every Service, PDB, PodMonitor and NetworkPolicy selects some pod.
func (r Render) CheckSelectors() []error {
	var errs []error
	for _, w := range r.Workloads() {
		if w.Kind == "Job" && w.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(w.Selector)
		if err != nil || sel.Empty() {
			errs = append(errs, fmt.Errorf("%s: selector %v: empty or invalid (%v)", w.ID(), w.Selector, err))
			continue
		}
		if !sel.Matches(labels.Set(w.Template.Labels)) {
			errs = append(errs, fmt.Errorf("%s: selector %s does not match its pod template labels %v", w.ID(), sel, w.Template.Labels))
		}
	}
	for _, o := range r.Objects {
		var sel labels.Selector
		var err error
		switch v := o.Obj.(type) {
		case *corev1.Service:
			if len(v.Spec.Selector) == 0 {
				errs = append(errs, fmt.Errorf("%s: no selector", o.ID()))
				continue
			}
			sel = labels.SelectorFromSet(v.Spec.Selector)
		case *policyv1.PodDisruptionBudget:
			sel, err = metav1.LabelSelectorAsSelector(v.Spec.Selector)
		case *PodMonitor:
			sel, err = metav1.LabelSelectorAsSelector(&v.Spec.Selector)
		case *networkingv1.NetworkPolicy:
			if len(v.Spec.PodSelector.MatchLabels) == 0 && len(v.Spec.PodSelector.MatchExpressions) == 0 {
				continue // every pod of the namespace
			}
			sel, err = metav1.LabelSelectorAsSelector(&v.Spec.PodSelector)
		default:
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: selector: %w", o.ID(), err))
			continue
		}
		if len(r.podsMatching(o.Namespace, sel)) == 0 {
			errs = append(errs, fmt.Errorf("%s: selector %s matches no pod", o.ID(), sel))
		}
	}
	return errs
}

// containerPort reports whether a container exposes port p (by name or
// number).
func containerPort(c corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return true
		}
	}
	return false
}

func podPort(spec corev1.PodSpec, p intstr.IntOrString) bool {
	return slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return containerPort(c, p) })
}

// CheckPorts checks that every probe names a port of its container and
// every Service targetPort a port of every pod it selects.
func (r Render) CheckPorts() []error {
	var errs []error
	for _, w := range r.Workloads() {
		for _, c := range w.Template.Spec.Containers {
			for kind, pr := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
				if pr == nil {
					continue
				}
				var p *intstr.IntOrString
				switch {
				case pr.GRPC != nil:
					v := intstr.FromInt32(pr.GRPC.Port)
					p = &v
				case pr.HTTPGet != nil:
					p = &pr.HTTPGet.Port
				case pr.TCPSocket != nil:
					p = &pr.TCPSocket.Port
				}
				if p != nil && !containerPort(c, *p) {
					errs = append(errs, fmt.Errorf("%s container %s: %s port %s is not a port of the container", w.ID(), c.Name, kind, p.String()))
				}
			}
		}
	}
	for _, o := range r.Objects {
		svc, ok := o.Obj.(*corev1.Service)
		if !ok || len(svc.Spec.Selector) == 0 {
			continue
		}
		for _, w := range r.podsMatching(o.Namespace, labels.SelectorFromSet(svc.Spec.Selector)) {
			for _, sp := range svc.Spec.Ports {
				tp := sp.TargetPort
				if tp.Type == intstr.Int && tp.IntVal == 0 {
					tp = intstr.FromInt32(sp.Port)
				}
				if !podPort(w.Template.Spec, tp) {
					errs = append(errs, fmt.Errorf("%s port %s: targetPort %s is not a port of %s", o.ID(), sp.Name, tp.String(), w.ID()))
				}
			}
		}
	}
	for _, o := range r.Objects {
		pm, ok := o.Obj.(*PodMonitor)
		if !ok {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil {
			continue
		}
		for _, w := range r.podsMatching(o.Namespace, sel) {
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				if !podPort(w.Template.Spec, intstr.FromString(ep.Port)) {
					errs = append(errs, fmt.Errorf("%s: port %s is not a port of %s", o.ID(), ep.Port, w.ID()))
				}
			}
		}
	}
	return errs
}

// pinned matches an image with a tag other than latest, or a digest.
var pinned = regexp.MustCompile(`^[^@]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})(@sha256:[0-9a-f]{64})?$|^[^@:]+(:[^@/]+)?@sha256:[0-9a-f]{64}$`)

// CheckImages checks that every image is pinned by a tag (not latest) or a
// digest.
func (r Render) CheckImages() []error {
	var errs []error
	for _, w := range r.Workloads() {
		for _, c := range slices.Concat(w.Template.Spec.InitContainers, w.Template.Spec.Containers) {
			if !pinned.MatchString(c.Image) || strings.HasSuffix(strings.Split(c.Image, "@")[0], ":latest") {
				errs = append(errs, fmt.Errorf("%s container %s: image %q is not pinned to a tag or digest", w.ID(), c.Name, c.Image))
			}
		}
	}
	return errs
}

// sensitive matches environment variable names that hold credentials.
var sensitive = regexp.MustCompile(`(?i)(PASSWORD|SECRET|TOKEN|API_KEY|APIKEY|CREDENTIAL|_DSN$|PRIVATE_KEY)`)

// devSecretNames are the throw-away Secrets the dev overlay may generate.
var devSecretNames = regexp.MustCompile(`^(postgres-dev|planex-sql|planex-smtp)(-[a-z0-9]+)?$`)

// CheckSecrets checks that no credential is inline: sensitive variables
// come from Secrets, and no Secret object ships (but the dev overlay's).
func (r Render) CheckSecrets() []error {
	var errs []error
	for _, o := range r.Objects {
		if o.Kind == "Secret" && !(r.DevSecrets && devSecretNames.MatchString(o.Name)) {
			errs = append(errs, fmt.Errorf("%s: a Secret in the manifests (credentials must be created by the operator, not shipped)", o.ID()))
		}
		if cm, ok := o.Obj.(*corev1.ConfigMap); ok {
			for k, v := range cm.Data {
				if sensitive.MatchString(k) && !strings.HasSuffix(k, "_FILE") || strings.Contains(v, "://") && strings.Contains(strings.SplitN(v, "://", 2)[1], ":") && strings.Contains(v, "@") {
					errs = append(errs, fmt.Errorf("%s: key %s looks like a credential in a ConfigMap", o.ID(), k))
				}
			}
		}
	}
	for _, w := range r.Workloads() {
		for _, c := range slices.Concat(w.Template.Spec.InitContainers, w.Template.Spec.Containers) {
			for _, e := range c.Env {
				// A *_FILE or *_DIR variable names a file or a directory
				// (CheckZeroTrust wants it on a mounted Secret), not the
				// credential itself.
				if sensitive.MatchString(e.Name) && e.Value != "" && !strings.HasSuffix(e.Name, "_FILE") && !strings.HasSuffix(e.Name, "_DIR") {
					errs = append(errs, fmt.Errorf("%s container %s: %s has an inline value; take it from a Secret", w.ID(), c.Name, e.Name))
				}
			}
		}
	}
	return errs
}

// CheckReferences checks that ConfigMaps referenced by workloads exist in
// the render (Secrets may be created by the operator), and that every
// autoscaler targets an existing Deployment.
func (r Render) CheckReferences() []error {
	var errs []error
	has := func(kind, name string) bool { return r.Find(kind, name) != nil }
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil && !has("ConfigMap", ef.ConfigMapRef.Name) {
					errs = append(errs, fmt.Errorf("%s container %s: envFrom ConfigMap %s does not exist", w.ID(), c.Name, ef.ConfigMapRef.Name))
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
					ref := e.ValueFrom.ConfigMapKeyRef
					cm, _ := r.Find("ConfigMap", ref.Name).(*corev1.ConfigMap)
					if cm == nil {
						errs = append(errs, fmt.Errorf("%s container %s: %s: ConfigMap %s does not exist", w.ID(), c.Name, e.Name, ref.Name))
					} else if _, ok := cm.Data[ref.Key]; !ok {
						errs = append(errs, fmt.Errorf("%s container %s: %s: ConfigMap %s has no key %s", w.ID(), c.Name, e.Name, ref.Name, ref.Key))
					}
				}
			}
			for _, vm := range c.VolumeMounts {
				if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }) &&
					!(w.Kind == "StatefulSet" && slices.ContainsFunc(w.Obj.(*appsv1.StatefulSet).Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == vm.Name })) {
					errs = append(errs, fmt.Errorf("%s container %s: volumeMount %s has no volume", w.ID(), c.Name, vm.Name))
				}
			}
		}
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil && !has("ConfigMap", v.ConfigMap.Name) {
				errs = append(errs, fmt.Errorf("%s: volume %s: ConfigMap %s does not exist", w.ID(), v.Name, v.ConfigMap.Name))
			}
			if v.PersistentVolumeClaim != nil && !has("PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName) {
				errs = append(errs, fmt.Errorf("%s: volume %s: PVC %s does not exist", w.ID(), v.Name, v.PersistentVolumeClaim.ClaimName))
			}
		}
	}
	return errs
}

// CheckAutoscaling checks that at most one autoscaler owns a Deployment,
// that nothing autoscales the search pool when it runs on a PVC (one
// writer), that KEDA never scales the search pool, and that KEDA's NATS
// endpoint is the headless Service of the NATS the render runs, in its
// namespace (or, without one, names no Service of the namespace that the
// render lacks).
func (r Render) CheckAutoscaling() []error {
	var errs []error
	owners := map[string][]string{}
	for _, o := range r.Objects {
		switch v := o.Obj.(type) {
		case *autoscalingv2.HorizontalPodAutoscaler:
			owners[v.Spec.ScaleTargetRef.Name] = append(owners[v.Spec.ScaleTargetRef.Name], o.ID())
		case *ScaledObject:
			t := v.Spec.ScaleTargetRef.Name
			owners[t] = append(owners[t], o.ID())
			if t == "planex-executor-search" || r.component("Deployment", t) == "planex-executor-search" {
				errs = append(errs, fmt.Errorf("%s: KEDA must not scale the search pool (one index writer)", o.ID()))
			}
			// A pool's queue is its consumer on PLANEX_STEPS and, on NATS
			// 2.11+, on PLANEX_EVENTS (docs/queues.md): scaling on one of
			// them misses the steps waiting in the other.
			streams := map[string]bool{}
			for _, tr := range v.Spec.Triggers {
				if tr.Type == "nats-jetstream" {
					streams[tr.Metadata["stream"]] = true
				}
			}
			if len(streams) > 0 && (!streams["PLANEX_STEPS"] || !streams["PLANEX_EVENTS"]) {
				errs = append(errs, fmt.Errorf("%s: KEDA scales on streams %v; want the pool's consumers on both PLANEX_STEPS and PLANEX_EVENTS", o.ID(), slices.Sorted(maps.Keys(streams))))
			}
			for _, tr := range v.Spec.Triggers {
				if tr.Type == "nats-jetstream" {
					if err := r.checkNATSMonitoringEndpoint(o, tr.Metadata["natsServerMonitoringEndpoint"]); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	for target, os := range owners {
		if r.Find("Deployment", target) == nil {
			errs = append(errs, fmt.Errorf("%v: target Deployment %s does not exist", os, target))
		}
		if len(os) > 1 {
			errs = append(errs, fmt.Errorf("Deployment %s has %d autoscalers (%s): they fight over replicas", target, len(os), strings.Join(os, ", ")))
		}
	}
	for _, o := range r.Objects {
		d, ok := o.Obj.(*appsv1.Deployment)
		if !ok || d.Spec.Template.Labels["app.kubernetes.io/name"] != "planex-executor-search" {
			continue
		}
		onPVC := slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.PersistentVolumeClaim != nil })
		if !onPVC {
			continue
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			errs = append(errs, fmt.Errorf("Deployment %s on a PVC: want 1 replica and strategy Recreate", o.Name))
		}
		if len(owners[o.Name]) > 0 {
			errs = append(errs, fmt.Errorf("%s on a PVC is autoscaled by %v", o.Name, owners[o.Name]))
		}
	}
	return errs
}

// component returns the app.kubernetes.io/name label of the pods of the
// workload kind/name, or "".
func (r Render) component(kind, name string) string {
	for _, w := range r.Workloads() {
		if w.Kind == kind && w.Name == name {
			return w.Template.Labels["app.kubernetes.io/name"]
		}
	}
	return ""
}

// checkNATSMonitoringEndpoint checks a KEDA NATS endpoint of object o: with
// a NATS StatefulSet in the render it must be that StatefulSet's headless
// Service in o's namespace, port 8222; without one it must not name a
// Service of o's namespace that the render does not have (the chart's
// headless Service when NATS is external).
func (r Render) checkNATSMonitoringEndpoint(o Object, ep string) error {
	for _, w := range r.Workloads() {
		sts, ok := w.Obj.(*appsv1.StatefulSet)
		if !ok || w.Template.Labels["app.kubernetes.io/name"] != "nats" {
			continue
		}
		prefix := sts.Spec.ServiceName + "." + o.Namespace + ".svc."
		if !strings.HasPrefix(ep, prefix) || !strings.HasSuffix(ep, ":8222") {
			return fmt.Errorf("%s: natsServerMonitoringEndpoint %q, want %q (the namespace NATS runs in)", o.ID(), ep, prefix+"cluster.local:8222")
		}
		return nil
	}
	host, _, err := net.SplitHostPort(ep)
	if err != nil || host == "" {
		return fmt.Errorf("%s: natsServerMonitoringEndpoint %q: want host:port", o.ID(), ep)
	}
	labels := strings.Split(host, ".")
	if len(labels) == 1 || len(labels) >= 3 && labels[1] == o.Namespace && labels[2] == "svc" {
		if r.Find("Service", labels[0]) == nil {
			return fmt.Errorf("%s: natsServerMonitoringEndpoint %q names Service %s of namespace %s, which does not exist (NATS is not in this render)", o.ID(), ep, labels[0], o.Namespace)
		}
	}
	return nil
}

// natsStartupBudget is the longest a planex service waits before it serves
// or exits: NATS connect (10s) + JetStream set-up (2 minutes), as in
// internal/service.
const natsStartupBudget = 130

// CheckProbeBudget checks that the startup probe of every planex service
// lasts at least as long as the code may wait for NATS.
func (r Render) CheckProbeBudget() []error {
	var errs []error
	for _, w := range r.Workloads() {
		if w.Template.Labels["planex.dev/service"] != "true" {
			continue
		}
		for _, c := range w.Template.Spec.Containers {
			p := c.StartupProbe
			if p == nil {
				errs = append(errs, fmt.Errorf("%s container %s: no startupProbe", w.ID(), c.Name))
				continue
			}
			if budget := p.PeriodSeconds * p.FailureThreshold; budget < natsStartupBudget {
				errs = append(errs, fmt.Errorf("%s container %s: startupProbe allows %ds, the process may wait %ds for NATS", w.ID(), c.Name, budget, natsStartupBudget))
			}
		}
	}
	return errs
}

package manifests

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// insecureEnv are the explicit opt-outs of zero trust: set to true, a
// render must say so (Render.Insecure).
var insecureEnv = []string{"PLANEX_PLAINTEXT", "PLANEX_AUTH_DISABLED", "PLANEX_ALLOW_UNSIGNED_STEPS"}

// requiredEnv are the settings each planex service needs for zero trust,
// by subcommand (the container's first argument); a "|" separates
// alternatives.
var requiredEnv = map[string][]string{
	"": {"PLANEX_TLS_CERT_FILE", "PLANEX_TLS_KEY_FILE", "PLANEX_TLS_CA_FILE", "PLANEX_NATS_NKEY_FILE|PLANEX_NATS_CREDS_FILE",
		"PLANEX_NATS_TLS_CA_FILE", "PLANEX_HEALTH_ADDR"},
	"supervisor": {"PLANEX_STEP_SIGNING_KEY_FILE", "PLANEX_AUTH_API_KEYS_FILE|PLANEX_AUTH_JWKS_FILE|PLANEX_AUTH_JWKS_URL"},
	"executor":   {"PLANEX_STEP_VERIFY_KEYS"},
}

// signingSecret is the suffix of the Secret holding the supervisor's
// private step signing key (planex-step-signing, <release>-planex-step-signing).
const signingSecret = "step-signing"

// signingSecrets are the Secrets that hold a step signing key: every Secret
// named *step-signing, and the Secret each supervisor reads
// PLANEX_STEP_SIGNING_KEY_FILE from.
func (r Render) signingSecrets() map[string]bool {
	out := map[string]bool{}
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		for _, c := range spec.Containers {
			if f := r.env(c)["PLANEX_STEP_SIGNING_KEY_FILE"]; strings.HasPrefix(f, "/") {
				if s := secretMount(spec, c, f); s != "" {
					out[s] = true
				}
			}
		}
		for _, v := range spec.Volumes {
			if v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, signingSecret) {
				out[v.Secret.SecretName] = true
			}
		}
	}
	return out
}

// env resolves a container's environment as the kubelet would for plain
// values: envFrom ConfigMaps of the render first, then env values; keys
// taken from Secrets or ConfigMap keys map to "<from Secret>" or the
// ConfigMap's value.
func (r Render) env(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm, ok := r.Find("ConfigMap", ef.ConfigMapRef.Name).(*corev1.ConfigMap); ok {
				for k, v := range cm.Data {
					out[ef.Prefix+k] = v
				}
			}
		}
		if ef.SecretRef != nil {
			out["<envFrom Secret "+ef.SecretRef.Name+">"] = ""
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "<from Secret>"
		case e.ValueFrom.ConfigMapKeyRef != nil:
			if cm, ok := r.Find("ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name).(*corev1.ConfigMap); ok {
				out[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
		default:
			out[e.Name] = ""
		}
	}
	return out
}

// secretMount returns the Secret mounted where path lies in the container
// ("" when path is on no Secret volume).
func secretMount(spec corev1.PodSpec, c corev1.Container, path string) string {
	best, secret := "", ""
	for _, vm := range c.VolumeMounts {
		if path != vm.MountPath && !strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") || len(vm.MountPath) <= len(best) {
			continue
		}
		best, secret = vm.MountPath, ""
		for _, v := range spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			switch {
			case v.Secret != nil:
				secret = v.Secret.SecretName
			case v.CSI != nil:
				secret = "csi:" + v.CSI.Driver
			case v.Projected != nil:
				// Only Secrets projected (none yet counts: a tenants'
				// credentials volume before the first tenant): the last.
				secret = "<projected Secrets>"
				for _, src := range v.Projected.Sources {
					if src.Secret == nil {
						secret = ""
						break
					}
					secret = src.Secret.Name
				}
			}
		}
	}
	return secret
}

// CheckZeroTrust checks the planex services' security wiring: no
// plaintext, unauthenticated or unsigned-step opt-out (unless the render
// is Insecure); TLS, NATS TLS and credentials, step keys and API
// authentication configured, every credential file on a mounted Secret;
// probes on the plaintext health port; the step signing key mounted into
// the supervisor only; bundled NATS with TLS and authorization from
// Secrets.
func (r Render) CheckZeroTrust() []error {
	var errs []error
	signing := r.signingSecrets()
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, vm := range c.VolumeMounts {
				if s := secretMount(spec, c, vm.MountPath); signing[s] && !(len(c.Args) > 0 && c.Args[0] == "supervisor") {
					errs = append(errs, fmt.Errorf("%s container %s: mounts the step signing key (Secret %s); only the supervisor may", w.ID(), c.Name, s))
				}
			}
		}
		if w.Template.Labels["planex.dev/service"] != "true" {
			if w.Template.Labels["app.kubernetes.io/name"] == "nats" && !r.Insecure {
				errs = append(errs, r.checkNATS(w)...)
			}
			if !r.Insecure {
				errs = append(errs, r.checkConsole(w)...)
			}
			continue
		}
		if len(spec.Containers) == 0 || len(spec.Containers[0].Args) == 0 {
			continue
		}
		c := spec.Containers[0]
		env := r.env(c)
		for _, k := range insecureEnv {
			if strings.EqualFold(env[k], "true") && !r.Insecure {
				errs = append(errs, fmt.Errorf("%s: %s=true in a render that is not an explicit plaintext opt-out", w.ID(), k))
			}
		}
		if r.Insecure {
			continue
		}
		for _, req := range slices.Concat(requiredEnv[""], requiredEnv[c.Args[0]]) {
			if !slices.ContainsFunc(strings.Split(req, "|"), func(k string) bool { return env[k] != "" }) {
				errs = append(errs, fmt.Errorf("%s: %s not set (zero trust needs it; see docs/security.md)", w.ID(), strings.ReplaceAll(req, "|", " or ")))
			}
		}
		if u := env["PLANEX_NATS_URL"]; !strings.HasPrefix(u, "tls://") {
			errs = append(errs, fmt.Errorf("%s: PLANEX_NATS_URL %q: want tls://", w.ID(), u))
		}
		for k, v := range env {
			if (strings.HasSuffix(k, "_FILE") || strings.HasSuffix(k, "_DIR") || k == "PLANEX_STEP_VERIFY_KEYS") && strings.HasPrefix(v, "/") && (sensitive.MatchString(k) || strings.Contains(k, "TLS") || strings.Contains(k, "NKEY") || strings.Contains(k, "STEP")) {
				if secretMount(spec, c, v) == "" {
					errs = append(errs, fmt.Errorf("%s: %s=%s is on no mounted Secret", w.ID(), k, v))
				}
			}
		}
		health := strings.TrimPrefix(env["PLANEX_HEALTH_ADDR"], ":")
		for kind, p := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if p != nil && p.GRPC != nil && fmt.Sprint(p.GRPC.Port) != health {
				errs = append(errs, fmt.Errorf("%s: %s on port %d, but the plaintext health port is PLANEX_HEALTH_ADDR %q (the API port speaks TLS)", w.ID(), kind, p.GRPC.Port, env["PLANEX_HEALTH_ADDR"]))
			}
		}
	}
	return errs
}

// checkNATS checks that the bundled NATS serves TLS and enforces the
// per-service authorization, both from mounted Secrets.
func (r Render) checkNATS(w Workload) []error {
	var errs []error
	spec := w.Template.Spec
	var conf string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			if cm, ok := r.Find("ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap); ok {
				conf += cm.Data["nats.conf"]
			}
		}
	}
	c := spec.Containers[0]
	for _, want := range []struct{ conf, path string }{{"cert_file:", "/etc/nats-tls/tls.crt"}, {"include", "/etc/nats-auth/auth.conf"}} {
		if !strings.Contains(conf, want.conf) {
			errs = append(errs, fmt.Errorf("%s: nats.conf has no %s (TLS and the planex authorization block are required)", w.ID(), strings.TrimSuffix(want.conf, ":")))
		}
		if secretMount(spec, c, want.path) == "" {
			errs = append(errs, fmt.Errorf("%s: %s is on no mounted Secret", w.ID(), want.path))
		}
	}
	return errs
}

// checkConsole checks a `planex console` container: HTTPS with a
// certificate and key on a mounted Secret, the supervisor verified with a
// CA on a mounted Secret, never --plaintext. Flags count as args
// (--flag=value) or as PLANEX_<FLAG> variables.
func (r Render) checkConsole(w Workload) []error {
	var errs []error
	spec := w.Template.Spec
	for _, c := range spec.Containers {
		if len(c.Args) == 0 || c.Args[0] != "console" {
			continue
		}
		env := r.env(c)
		flag := func(name string) string {
			for _, a := range c.Args[1:] {
				if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
					return v
				}
				if a == "--"+name {
					return "true"
				}
			}
			return env["PLANEX_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]
		}
		if strings.EqualFold(flag("plaintext"), "true") {
			errs = append(errs, fmt.Errorf("%s container %s: console --plaintext to the supervisor in a render that is not an explicit plaintext opt-out", w.ID(), c.Name))
		}
		for _, f := range []string{"http-tls-cert-file", "http-tls-key-file", "tls-ca-file"} {
			v := flag(f)
			switch {
			case v == "":
				errs = append(errs, fmt.Errorf("%s container %s: console --%s not set (HTTPS and a verified supervisor are required)", w.ID(), c.Name, f))
			case secretMount(spec, c, v) == "":
				errs = append(errs, fmt.Errorf("%s container %s: console --%s=%s is on no mounted Secret", w.ID(), c.Name, f, v))
			}
		}
	}
	return errs
}

// CheckCertificates checks, when a render issues certificates with
// cert-manager, that every mounted TLS Secret (named *-tls-<service> or
// *-tls, as planex-tls-supervisor and nats-tls) has its Certificate, that
// the supervisor's carries the admin OU (it calls the planner) and no
// other does, and that each names a Service that selects the pods.
func (r Render) CheckCertificates() []error {
	certs := map[string]*Certificate{}
	for _, o := range r.Objects {
		if c, ok := o.Obj.(*Certificate); ok {
			certs[c.Spec.SecretName] = c
		}
	}
	if len(certs) == 0 {
		return nil
	}
	var errs []error
	for _, w := range r.Workloads() {
		for _, v := range w.Template.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			c := certs[v.Secret.SecretName]
			// The chart's and kustomize's TLS Secrets: <prefix>tls-<service>
			// and <nats>-tls (a Secret of the operator's, named otherwise,
			// needs no Certificate).
			tlsSecret := strings.Contains(v.Secret.SecretName, "-tls-") || strings.HasSuffix(v.Secret.SecretName, "-tls")
			if c == nil {
				if tlsSecret {
					errs = append(errs, fmt.Errorf("%s: TLS Secret %s has no cert-manager Certificate", w.ID(), v.Secret.SecretName))
				}
				continue
			}
			component := w.Template.Labels["app.kubernetes.io/name"]
			admin := c.Spec.Subject != nil && slices.Contains(c.Spec.Subject.OrganizationalUnits, "admin")
			if admin != (component == "planex-supervisor") {
				errs = append(errs, fmt.Errorf("Certificate %s: OU admin %v; only the supervisor's certificate is admin", c.Name, admin))
			}
			services := r.servicesSelecting(w)
			if len(services) > 0 && !slices.ContainsFunc(services, func(s string) bool { return slices.Contains(c.Spec.DNSNames, s) }) {
				errs = append(errs, fmt.Errorf("Certificate %s: DNS names %v lack the Service name %s", c.Name, c.Spec.DNSNames, strings.Join(services, " or ")))
			}
		}
	}
	return errs
}

// servicesSelecting returns the names of the Services (not headless) that
// select the workload's pods.
func (r Render) servicesSelecting(w Workload) []string {
	var out []string
	for _, o := range r.Objects {
		svc, ok := o.Obj.(*corev1.Service)
		if !ok || o.Namespace != w.Namespace || len(svc.Spec.Selector) == 0 || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.Template.Labels)) {
			out = append(out, o.Name)
		}
	}
	return out
}

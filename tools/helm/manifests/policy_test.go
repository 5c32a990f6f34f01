package manifests

import (
	"os"
	"path"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// checkPolicy checks a kustomize render that includes components/policy:
// ConfigMap planex-policy carries the namespace ns itself (decoded without
// a default namespace: `kubectl apply -k` would put an object without one
// into the context's namespace, and the supervisor would wait on a missing
// ConfigMap), holds components/policy/default.yaml unchanged, and is what
// the supervisor Deployment of the same namespace mounts and loads with
// PLANEX_POLICY.
func checkPolicy(t *testing.T, out []byte, ns string) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "components", "policy", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(out, "")
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	var cm *corev1.ConfigMap
	var sup *appsv1.Deployment
	for _, o := range objs {
		switch {
		case o.Kind == "ConfigMap" && o.Name == "planex-policy":
			if o.Namespace != ns {
				t.Errorf("%s: namespace %q, want %q", o.ID(), o.Namespace, ns)
			}
			cm = o.Obj.(*corev1.ConfigMap)
		case o.Kind == "Deployment" && o.Name == "planex-supervisor":
			if o.Namespace != ns {
				t.Errorf("%s: namespace %q, want %q", o.ID(), o.Namespace, ns)
			}
			sup = o.Obj.(*appsv1.Deployment)
		}
	}
	if cm == nil {
		t.Fatal("components/policy: no ConfigMap planex-policy")
	}
	if sup == nil {
		t.Fatal("components/policy: no Deployment planex-supervisor")
	}
	if got := cm.Data["default.yaml"]; got != string(want) {
		t.Errorf("ConfigMap planex-policy: key default.yaml differs from components/policy/default.yaml (%d vs %d bytes)", len(got), len(want))
	}
	checkSupervisorLoadsPolicy(t, sup, cm)
}

// checkSupervisorLoadsPolicy checks that the supervisor container mounts
// ConfigMap cm read-only and that PLANEX_POLICY names a key of it under
// that mount.
func checkSupervisorLoadsPolicy(t *testing.T, sup *appsv1.Deployment, cm *corev1.ConfigMap) {
	t.Helper()
	spec := sup.Spec.Template.Spec
	var volume string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			volume = v.Name
		}
	}
	if volume == "" {
		t.Fatalf("Deployment planex-supervisor: no volume from ConfigMap %s", cm.Name)
	}
	var c *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "supervisor" {
			c = &spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatal("Deployment planex-supervisor: no container supervisor")
	}
	var mount string
	for _, vm := range c.VolumeMounts {
		if vm.Name == volume {
			if !vm.ReadOnly {
				t.Errorf("container supervisor: volumeMount %s is not readOnly", vm.Name)
			}
			mount = vm.MountPath
		}
	}
	if mount == "" {
		t.Fatalf("container supervisor: volume %s (ConfigMap %s) is not mounted", volume, cm.Name)
	}
	var policy string
	for _, e := range c.Env {
		if e.Name == "PLANEX_POLICY" {
			policy = e.Value
		}
	}
	if policy == "" {
		t.Fatal("container supervisor: PLANEX_POLICY is not set")
	}
	if dir, key := path.Split(policy); path.Clean(dir) != path.Clean(mount) {
		t.Errorf("container supervisor: PLANEX_POLICY=%s is not under the mount %s of ConfigMap %s", policy, mount, cm.Name)
	} else if _, ok := cm.Data[key]; !ok {
		t.Errorf("container supervisor: PLANEX_POLICY=%s: ConfigMap %s has no key %s", policy, cm.Name, key)
	}
}

// TestPolicyReplacedInOverlay follows deploy/k8s/README.md: a kustomization
// on top of the one that lists components/policy replaces ConfigMap
// planex-policy with a configMapGenerator of its own and gets its rules, in
// the namespace, still mounted by the supervisor. (In the kustomization
// that lists the component it cannot: kustomize runs a kustomization's
// generators before its components.)
func TestPolicyReplacedInOverlay(t *testing.T) {
	k := k8sFS(t)
	const rules = "name: acme\nrules: []\n"
	if err := k.Write("acme/default.yaml", rules); err != nil {
		t.Fatal(err)
	}
	if err := k.Write("acme/guarded/kustomization.yaml", `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../overlays/production
components:
  - ../../components/policy
`); err != nil {
		t.Fatal(err)
	}
	if err := k.Write("acme/kustomization.yaml", `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - guarded
configMapGenerator:
  - name: planex-policy
    namespace: planex
    behavior: replace
    files:
      - default.yaml
    options:
      disableNameSuffixHash: true
`); err != nil {
		t.Fatal(err)
	}
	out, err := k.Build("acme")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(out, "")
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	r := Render{Name: "acme", Namespace: "planex", Objects: objs}
	cm, ok := r.Find("ConfigMap", "planex-policy").(*corev1.ConfigMap)
	if !ok {
		t.Fatal("no ConfigMap planex-policy")
	}
	if cm.Data["default.yaml"] != rules {
		t.Errorf("ConfigMap planex-policy: default.yaml = %q, want the overlay's %q", cm.Data["default.yaml"], rules)
	}
	for _, o := range objs {
		if o.Kind == "ConfigMap" && o.Name == "planex-policy" && o.Namespace != "planex" {
			t.Errorf("%s: namespace %q, want planex", o.ID(), o.Namespace)
		}
	}
	sup, ok := r.Find("Deployment", "planex-supervisor").(*appsv1.Deployment)
	if !ok {
		t.Fatal("no Deployment planex-supervisor")
	}
	checkSupervisorLoadsPolicy(t, sup, cm)
}

package manifests

import (
	"context"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// tenantsValues is the two-team values file CI renders (team-a with its
// own sql pool, team-b with its own search and email pools).
const tenantsValues = "ci/values-tenants.yaml"

// tenantPools are the tenant pools of tenantsValues: Deployment name →
// tenant, pool and the Secret holding the tenant's nkey seeds.
var tenantPools = map[string]struct{ tenant, pool, secret string }{
	"planex-executor-team-a-sql":    {"team-a", "sql", "planex-tenant-team-a-nats"},
	"planex-executor-team-b-search": {"team-b", "search", "team-b-nats-seeds"},
	"planex-executor-team-b-email":  {"team-b", "email", "team-b-nats-seeds"},
}

// tenantSecrets are the tenants' nkey Secrets of tenantsValues.
var tenantSecrets = map[string]string{"team-a": "planex-tenant-team-a-nats", "team-b": "team-b-nats-seeds"}

// tenantFields are the protobuf JSON names of planex.v1.Tenant's spec
// (proto/planex/v1/tenant.proto) a tenants file may hold.
var tenantFields = []string{"name", "description", "members", "pools", "quotas", "retention", "budget", "policies"}

// renderTenants renders the chart with ci/values-tenants.yaml and more
// values files, checks it like every CI render and returns it.
func renderTenants(t *testing.T, o HelmOptions, more ...string) Render {
	t.Helper()
	o.ValueFiles = append([]string{filepath.Join(chartDir(t), tenantsValues)}, more...)
	if o.Namespace == "" {
		o.Namespace = "agents"
	}
	r := renderChart(t, o)
	errs := r.Check()
	if o.Release != "" && o.Release != "planex" {
		// The flow model looks objects up by a release planex's names.
		errs = append(r.CheckButNetworkPolicies(), legacyNames(r, o.Release+"-planex").CheckNetworkPolicies()...)
	}
	if len(errs) > 0 {
		t.Fatalf("%d problems:%s", len(errs), describe(errs))
	}
	return r
}

// deployment returns the Deployment whose pods are app.kubernetes.io/name
// name, or fails the test.
func deployment(t *testing.T, r Render, name string) *appsv1.Deployment {
	t.Helper()
	for _, w := range r.Workloads() {
		if d, ok := w.Obj.(*appsv1.Deployment); ok && w.Template.Labels["app.kubernetes.io/name"] == name {
			return d
		}
	}
	t.Fatalf("no Deployment %s in the render", name)
	return nil
}

// volume returns the pod's volume mounted at path in its first container
// (the mount's subPath must be empty: the kubelet updates only whole
// volumes), or fails.
func volume(t *testing.T, d *appsv1.Deployment, path string) corev1.Volume {
	t.Helper()
	spec := d.Spec.Template.Spec
	for _, vm := range spec.Containers[0].VolumeMounts {
		if vm.MountPath != path {
			continue
		}
		if vm.SubPath != "" || !vm.ReadOnly {
			t.Errorf("%s: mount %s: subPath %q readOnly %v, want the whole volume read-only", d.Name, path, vm.SubPath, vm.ReadOnly)
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name {
				return v
			}
		}
	}
	t.Fatalf("%s: nothing mounted at %s", d.Name, path)
	return corev1.Volume{}
}

// TestHelmTenants renders the two-team values: the tenants ConfigMap holds
// the tenants as the supervisor's --tenants-file reads them, the
// supervisor gets the tenants file, each tenant's supervisor.nk, the
// price table and the JWT tenant claim, and each tenant's pool connects
// with its tenant's identity executor-<pool> and nothing else.
func TestHelmTenants(t *testing.T) {
	r := renderTenants(t, HelmOptions{})

	// The ConfigMap: the values' tenants, without the chart's natsSecret.
	cm, _ := r.Find("ConfigMap", "planex-tenants").(*corev1.ConfigMap)
	if cm == nil {
		t.Fatal("no ConfigMap planex-tenants")
	}
	var got []map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["tenants.yaml"]), &got); err != nil {
		t.Fatalf("tenants.yaml: %v\n%s", err, cm.Data["tenants.yaml"])
	}
	raw, err := os.ReadFile(filepath.Join(chartDir(t), tenantsValues))
	if err != nil {
		t.Fatal(err)
	}
	var vals struct {
		Tenants []map[string]any `json:"tenants"`
	}
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		t.Fatal(err)
	}
	for _, tn := range vals.Tenants {
		delete(tn, "natsSecret")
	}
	if jsonOf(got) != jsonOf(vals.Tenants) {
		t.Errorf("tenants.yaml:\n  got  %s\n  want %s", jsonOf(got), jsonOf(vals.Tenants))
	}
	if len(got) != 2 || got[0]["name"] != "team-a" || got[1]["name"] != "team-b" {
		t.Fatalf("tenants.yaml: want team-a and team-b, got %s", jsonOf(got))
	}
	for _, tn := range got {
		for k := range tn {
			if !slices.Contains(tenantFields, k) {
				t.Errorf("tenants.yaml: tenant %v: field %q is no planex.v1.Tenant spec field", tn["name"], k)
			}
		}
	}
	a := got[0]
	quotas, _ := a["quotas"].(map[string]any)
	steps, _ := quotas["poolStepsInFlight"].(map[string]any)
	if quotas["maxConcurrentRuns"] != 50.0 || quotas["startsPerSecond"] != 5.0 || quotas["moneyPerMonthMicros"] != 5e8 || steps["sql"] != 20.0 {
		t.Errorf("team-a quotas %s", jsonOf(quotas))
	}
	if a["retention"] != "2592000s" || !strings.Contains(a["policies"].(string), "sql-exec-needs-team-a-approval") {
		t.Errorf("team-a retention %v policies %q", a["retention"], a["policies"])
	}

	// The supervisor: flags (PLANEX_<FLAG>) and what they point at.
	sup := deployment(t, r, "planex-supervisor")
	env := r.env(sup.Spec.Template.Spec.Containers[0])
	want := map[string]string{
		"PLANEX_TENANTS_FILE":           "/etc/planex/tenants/tenants.yaml",
		"PLANEX_TENANT_CREDENTIALS_DIR": "/etc/planex/tenant-credentials",
		"PLANEX_MODEL_PRICES":           "/etc/planex/model-prices/model-prices.json",
		"PLANEX_AUTH_JWT_TENANT_CLAIM":  "team",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("supervisor %s=%q, want %q", k, env[k], v)
		}
	}
	if v := volume(t, sup, "/etc/planex/tenants"); v.ConfigMap == nil || v.ConfigMap.Name != "planex-tenants" {
		t.Errorf("supervisor /etc/planex/tenants: %s, want ConfigMap planex-tenants", jsonOf(v))
	}
	if v := volume(t, sup, "/etc/planex/model-prices"); v.ConfigMap == nil || v.ConfigMap.Name != "planex-model-prices" {
		t.Errorf("supervisor /etc/planex/model-prices: %s", jsonOf(v))
	} else if prices := r.Find("ConfigMap", "planex-model-prices").(*corev1.ConfigMap).Data["model-prices.json"]; !strings.Contains(prices, `"input_per_million_micros": 150000`) {
		t.Errorf("model-prices.json: %s", prices)
	}
	creds := volume(t, sup, "/etc/planex/tenant-credentials")
	if creds.Projected == nil {
		t.Fatalf("supervisor tenant credentials: %s, want a projected volume", jsonOf(creds))
	}
	projected := map[string]string{} // file → Secret/key
	for _, src := range creds.Projected.Sources {
		if src.Secret == nil || src.Secret.Optional == nil || !*src.Secret.Optional {
			t.Errorf("tenant credentials source %s: want an optional Secret (the supervisor starts before a tenant's Secret exists)", jsonOf(src))
			continue
		}
		for _, it := range src.Secret.Items {
			projected[it.Path] = src.Secret.Name + "/" + it.Key
		}
	}
	wantProjected := map[string]string{
		"team-a/supervisor.nk": "planex-tenant-team-a-nats/supervisor.nk",
		"team-b/supervisor.nk": "team-b-nats-seeds/supervisor.nk",
	}
	if !maps.Equal(projected, wantProjected) {
		t.Errorf("supervisor tenant credentials %v, want %v", projected, wantProjected)
	}
	if m := *creds.Projected.DefaultMode; m != 0o440 {
		t.Errorf("tenant credentials mode %o, want 440", m)
	}
	// Its own identity stays the default tenant's.
	if s := secretVolume(sup.Spec.Template.Spec, "nats-creds"); s == nil || s.SecretName != "planex-nats-supervisor" || len(s.Items) != 0 {
		t.Errorf("supervisor nats-creds %s", jsonOf(s))
	}

	// Each tenant's pool: --pool, the tenant's Secret key executor-<pool>.nk
	// as its nkey, labels naming tenant and pool.
	for name, tp := range tenantPools {
		d := deployment(t, r, name)
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		if !slices.Equal(c.Args, []string{"executor", "--pool=" + tp.pool}) {
			t.Errorf("%s args %v", name, c.Args)
		}
		if l := d.Spec.Template.Labels; l["planex.dev/tenant"] != tp.tenant || l["planex.dev/pool"] != tp.pool {
			t.Errorf("%s labels %v", name, l)
		}
		s := secretVolume(spec, "nats-creds")
		if s == nil || s.SecretName != tp.secret || len(s.Items) != 1 || s.Items[0].Key != "executor-"+tp.pool+".nk" || s.Items[0].Path != "nkey" {
			t.Errorf("%s nats-creds %s, want %s key executor-%s.nk as nkey", name, jsonOf(s), tp.secret, tp.pool)
		}
		if f := r.env(c)["PLANEX_NATS_NKEY_FILE"]; f != "/etc/planex/nats/nkey" || secretMount(spec, c, f) != tp.secret {
			t.Errorf("%s: PLANEX_NATS_NKEY_FILE %q on Secret %q, want on %s", name, f, secretMount(spec, c, f), tp.secret)
		}
		// Its steps are signed for its tenant: the executor must know it.
		if got := r.env(c)["PLANEX_TENANT"]; got != tp.tenant {
			t.Errorf("%s: PLANEX_TENANT %q, want %q", name, got, tp.tenant)
		}
		if tls := secretVolume(spec, "tls"); tls == nil || tls.SecretName != "planex-tls-executor-"+tp.pool {
			t.Errorf("%s tls %s, want the pool's planex-tls-executor-%s", name, jsonOf(tls), tp.pool)
		}
	}
	team := deployment(t, r, "planex-executor-team-a-sql")
	if *team.Spec.Replicas != 1 {
		t.Errorf("team-a-sql replicas %d, want its own 1", *team.Spec.Replicas)
	}
	for _, e := range team.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "PLANEX_SQL_DSN" && (e.ValueFrom.SecretKeyRef.Name != "team-a-sql" || e.ValueFrom.SecretKeyRef.Key != "dsn") {
			t.Errorf("team-a-sql DSN from %s, want team-a-sql/dsn", jsonOf(e.ValueFrom))
		}
	}
	if r.Find("HorizontalPodAutoscaler", "planex-executor-team-a-sql") != nil {
		t.Error("team-a-sql autoscaling.enabled false (over executors.sql's true) still got an HPA")
	}
	if r.Find("PersistentVolumeClaim", "planex-executor-team-b-search-index") == nil || r.Find("PersistentVolumeClaim", "planex-search-index") != nil {
		t.Error("team-b-search's persistence: want its own PVC planex-executor-team-b-search-index, and none for the default search pool")
	}
	email := deployment(t, r, "planex-executor-team-b-email")
	if got := r.env(email.Spec.Template.Spec.Containers[0]); got["PLANEX_EMAIL_ALLOWED_DOMAINS"] != "support.example.com" || got["PLANEX_EMAIL_FROM"] != "support@example.com" {
		t.Errorf("team-b-email allowed domains %q from %q", got["PLANEX_EMAIL_ALLOWED_DOMAINS"], got["PLANEX_EMAIL_FROM"])
	}
	if got := r.env(deployment(t, r, "planex-executor-email").Spec.Template.Spec.Containers[0]); got["PLANEX_EMAIL_ALLOWED_DOMAINS"] != "example.com" {
		t.Errorf("default email pool allowed domains %q: team-b's leaked into it", got["PLANEX_EMAIL_ALLOWED_DOMAINS"])
	}

	// No pod but the supervisor mounts a supervisor.nk; no pod mounts a
	// key of a tenant's Secret but its own pool's.
	for _, w := range r.Workloads() {
		name := w.Template.Labels["app.kubernetes.io/name"]
		for _, v := range w.Template.Spec.Volumes {
			var refs []string // Secret/key
			if v.Secret != nil && slices.Contains(slices.Collect(maps.Values(tenantSecrets)), v.Secret.SecretName) {
				if len(v.Secret.Items) == 0 {
					refs = append(refs, v.Secret.SecretName+"/*")
				}
				for _, it := range v.Secret.Items {
					refs = append(refs, v.Secret.SecretName+"/"+it.Key)
				}
			}
			if v.Projected != nil {
				for _, src := range v.Projected.Sources {
					if src.Secret != nil {
						for _, it := range src.Secret.Items {
							refs = append(refs, src.Secret.Name+"/"+it.Key)
						}
					}
				}
			}
			for _, ref := range refs {
				tp, pool := tenantPools[name]
				switch {
				case name == "planex-supervisor" && strings.HasSuffix(ref, "/supervisor.nk"):
				case pool && ref == tp.secret+"/executor-"+tp.pool+".nk":
				default:
					t.Errorf("%s mounts %s: only the supervisor reads supervisor.nk, and a tenant's pool its own executor-<pool>.nk", w.ID(), ref)
				}
			}
		}
	}
	// The default tenant's pools keep their own identities.
	for _, pool := range []string{"sql", "email", "search"} {
		d := deployment(t, r, "planex-executor-"+pool)
		if s := secretVolume(d.Spec.Template.Spec, "nats-creds"); s == nil || s.SecretName != "planex-nats-executor-"+pool || len(s.Items) != 0 {
			t.Errorf("default pool %s nats-creds %s", pool, jsonOf(s))
		}
		if _, ok := d.Spec.Template.Labels["planex.dev/tenant"]; ok {
			t.Errorf("default pool %s carries a tenant label", pool)
		}
	}
}

// TestHelmTenantsWith renders the two teams with KEDA, with cert-manager
// and as a release not named planex: KEDA reads a tenant pool's lag in
// the tenant's NATS account, the pool's Certificate names the tenant
// pools' Services, and the tenants' Secret names do not follow the
// release (`planex auth k8s-secrets --tenant` names them).
func TestHelmTenantsWith(t *testing.T) {
	t.Run("keda", func(t *testing.T) {
		r := renderTenants(t, HelmOptions{Set: []string{"keda.enabled=true"}})
		accounts := map[string]string{}
		for _, o := range r.Objects {
			if so, ok := o.Obj.(*ScaledObject); ok {
				for _, tr := range so.Spec.Triggers {
					accounts[so.Spec.ScaleTargetRef.Name] = tr.Metadata["account"]
				}
			}
		}
		// The default tenant's account is planex-default once there are
		// tenants (planex auth k8s-secrets --tenant).
		want := map[string]string{"planex-executor-sql": "planex-default", "planex-executor-email": "planex-default",
			"planex-executor-team-a-sql": "planex-tenant-team-a", "planex-executor-team-b-email": "planex-tenant-team-b"}
		if !maps.Equal(accounts, want) {
			t.Errorf("KEDA accounts %v, want %v", accounts, want)
		}
	})
	t.Run("cert-manager", func(t *testing.T) {
		r := renderTenants(t, HelmOptions{Set: []string{"security.tls.certManager.enabled=true"}})
		var sql *Certificate
		n := 0
		for _, o := range r.Objects {
			if c, ok := o.Obj.(*Certificate); ok {
				n++
				if c.Spec.SecretName == "planex-tls-executor-sql" {
					sql = c
				}
			}
		}
		if sql == nil || !slices.Contains(sql.Spec.DNSNames, "planex-executor-team-a-sql.agents.svc") || !slices.Contains(sql.Spec.DNSNames, "planex-executor-sql") {
			t.Fatalf("Certificate planex-tls-executor-sql: %s", jsonOf(sql))
		}
		// supervisor, planner, executor-sql, -email, -search, and NATS:
		// the tenants' pools share their pool's.
		if n != 6 {
			t.Errorf("%d Certificates, want 6 (one per TLS Secret)", n)
		}
	})
	t.Run("release agents", func(t *testing.T) {
		r := renderTenants(t, HelmOptions{Release: "agents"})
		sup := deployment(t, r, "planex-supervisor")
		if v := volume(t, sup, "/etc/planex/tenants"); v.ConfigMap == nil || v.ConfigMap.Name != "agents-planex-tenants" {
			t.Errorf("tenants ConfigMap %s, want agents-planex-tenants", jsonOf(v))
		}
		if s := secretVolume(deployment(t, r, "planex-executor-team-a-sql").Spec.Template.Spec, "nats-creds"); s == nil || s.SecretName != "planex-tenant-team-a-nats" {
			t.Errorf("team-a-sql nats-creds %s", jsonOf(s))
		}
	})
	t.Run("only the default sql pool for a tenant", func(t *testing.T) {
		// executors.sql itself can be a tenant's: the default tenant then
		// has no sql pool.
		r := renderTenants(t, HelmOptions{Set: []string{"executors.sql.tenant=team-a", "executors.team-a-sql.enabled=false"}})
		d := deployment(t, r, "planex-executor-sql")
		if s := secretVolume(d.Spec.Template.Spec, "nats-creds"); s == nil || s.SecretName != "planex-tenant-team-a-nats" || s.Items[0].Key != "executor-sql.nk" {
			t.Errorf("executors.sql with tenant team-a: nats-creds %s", jsonOf(s))
		}
		if r.Find("Deployment", "planex-executor-team-a-sql") != nil {
			t.Error("executors.team-a-sql.enabled=false still deployed")
		}
	})
}

// TestHelmWithoutTenants checks that an installation without tenants
// renders nothing of them: the default tenant is the installation as it
// was.
func TestHelmWithoutTenants(t *testing.T) {
	r := renderChart(t, HelmOptions{Namespace: "agents"})
	for _, cm := range []string{"planex-tenants", "planex-model-prices"} {
		if r.Find("ConfigMap", cm) != nil {
			t.Errorf("ConfigMap %s without tenants / modelPrices", cm)
		}
	}
	sup := deployment(t, r, "planex-supervisor")
	env := r.env(sup.Spec.Template.Spec.Containers[0])
	for _, k := range []string{"PLANEX_TENANTS_FILE", "PLANEX_TENANT_CREDENTIALS_DIR", "PLANEX_MODEL_PRICES", "PLANEX_AUTH_JWT_TENANT_CLAIM"} {
		if _, ok := env[k]; ok {
			t.Errorf("supervisor %s set without tenants", k)
		}
	}
	for _, v := range sup.Spec.Template.Spec.Volumes {
		if v.Projected != nil || v.Name == "tenants" {
			t.Errorf("supervisor volume %s without tenants", v.Name)
		}
	}
}

// TestHelmTenantsRejects proves bad tenant values fail the render with an
// error naming the field: the schema refuses malformed and reserved
// names, the templates what the schema cannot see (references between
// tenants and pools, duplicates, a NATS without nkey users).
func TestHelmTenantsRejects(t *testing.T) {
	dir := chartDir(t)
	tenantsFile := filepath.Join(dir, tenantsValues)
	cases := []struct {
		name, values string
		// base adds ci/values-tenants.yaml first.
		base bool
		// schema: the schema (not a template) must refuse it.
		schema bool
		want   []string
	}{
		{"upper-case name", "tenants: [{name: Team-A}]", false, true, []string{"/tenants/0/name"}},
		{"name with an underscore", "tenants: [{name: team_a}]", false, true, []string{"/tenants/0/name"}},
		{"name too long", "tenants: [{name: " + strings.Repeat("a", 32) + "}]", false, true, []string{"/tenants/0/name"}},
		{"name starting with a digit", "tenants: [{name: 1team}]", false, true, []string{"/tenants/0/name"}},
		{"the default tenant", "tenants: [{name: default}]", false, true, []string{"/tenants/0/name"}},
		{"no name", "tenants: [{description: x}]", false, true, []string{"/tenants/0", "name"}},
		{"snake_case field", "tenants: [{name: a, max_concurrent_runs: 1}]", false, true, []string{"/tenants/0", "max_concurrent_runs"}},
		{"misspelt quota", "tenants: [{name: a, quotas: {maxConcurentRuns: 1}}]", false, true, []string{"/tenants/0/quotas", "maxConcurentRuns"}},
		{"negative quota", "tenants: [{name: a, quotas: {tokensPerDay: -1}}]", false, true, []string{"/tenants/0/quotas/tokensPerDay", "minimum"}},
		{"retention without a unit", "tenants: [{name: a, retention: \"30\"}]", false, true, []string{"/tenants/0/retention"}},
		{"bad subject", "tenants: [{name: a, members: {subjects: [alice]}}]", false, true, []string{"/tenants/0/members/subjects/0"}},
		{"pool tenant default", "executors: {sql: {tenant: default}}", false, true, []string{"/executors/sql/tenant"}},
		{"tenant pool without tenant", "executors: {team-a-sql: {pool: sql}}", false, true, []string{"/executors/team-a-sql", "tenant"}},
		{"tenant pool of an unknown pool", "executors: {team-a-ftp: {pool: ftp, tenant: team-a}}", false, true, []string{"/executors/team-a-ftp/pool"}},
		{"model price misspelt", "modelPrices: {m: {input_per_million: 1, output_per_million_micros: 1}}", false, true, []string{"/modelPrices/m"}},
		{"JWT tenant claim with a space", "security: {auth: {jwtTenantClaim: \"a b\"}}", false, true, []string{"/security/auth/jwtTenantClaim"}},

		{"pool of an unknown tenant", "executors: {team-c-sql: {pool: sql, tenant: team-c}}", true, false, []string{"executors.team-c-sql.tenant", "team-c", "not in tenants"}},
		{"pool the tenant does not list", "executors: {team-a-email: {pool: email, tenant: team-a}}", true, false, []string{"executors.team-a-email", "does not list pool email"}},
		{"two pools of one tenant and pool", "executors: {team-a-sql2: {pool: sql, tenant: team-a}}", true, false, []string{"executors.team-a-sql2", "already runs pool sql"}},
		{"duplicate tenant", "tenants: [{name: a}, {name: a}]", false, false, []string{"tenants[1].name", "also tenants[0]"}},
		{"tenants without NATS auth", "security: {insecurePlaintext: true}", true, false, []string{"tenants", "insecurePlaintext"}},
		{"tenants with NATS credentials files", "nats: {bundled: false, external: {url: \"tls://nats.messaging:4222\", credentialsSecret: nats-creds}}", true, false, []string{"tenants", "nkeys"}},
	}
	tmp := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(tmp, strings.ReplaceAll(c.name, " ", "-")+".yaml")
			if err := os.WriteFile(f, []byte(c.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			files := []string{f}
			if c.base {
				files = []string{tenantsFile, f}
			}
			_, err := HelmTemplate(dir, "agents", files...)
			if err == nil {
				t.Fatalf("case %d: %q rendered; it must be refused", i, c.values)
			}
			if c.schema != strings.Contains(err.Error(), "schema") {
				t.Errorf("refused by the schema: %v, want %v: %v", !c.schema, c.schema, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestKustomizeTenants renders components/tenants on the production
// overlay with a tenant added the way its kustomization says (a patch
// listing the tenant's Secret in the supervisor's projected volume): the
// supervisor reads the tenants file from ConfigMap planex-tenants and the
// tenant's supervisor.nk from its Secret, and every check passes.
func TestKustomizeTenants(t *testing.T) {
	k := k8sFS(t)
	if err := k.Write("combinations/tenants-team-a/kustomization.yaml", `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../overlays/production
components:
  - ../../components/tenants
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: planex-supervisor}
      spec:
        template:
          spec:
            volumes:
              - name: tenant-credentials
                projected:
                  sources:
                    - secret:
                        name: planex-tenant-team-a-nats
                        optional: true
                        items: [{key: supervisor.nk, path: team-a/supervisor.nk}]
`); err != nil {
		t.Fatal(err)
	}
	out, err := k.Build("combinations/tenants-team-a")
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "production+tenants+team-a", out, "planex", false)
	if errs := r.Check(); len(errs) > 0 {
		t.Fatalf("%d problems:%s", len(errs), describe(errs))
	}
	sup := deployment(t, r, "planex-supervisor")
	env := r.env(sup.Spec.Template.Spec.Containers[0])
	if env["PLANEX_TENANTS_FILE"] != "/etc/planex/tenants/tenants.yaml" || env["PLANEX_TENANT_CREDENTIALS_DIR"] != "/etc/planex/tenant-credentials" {
		t.Errorf("supervisor tenants file %q credentials dir %q", env["PLANEX_TENANTS_FILE"], env["PLANEX_TENANT_CREDENTIALS_DIR"])
	}
	cm, _ := r.Find("ConfigMap", "planex-tenants").(*corev1.ConfigMap)
	if v := volume(t, sup, "/etc/planex/tenants"); cm == nil || v.ConfigMap == nil || v.ConfigMap.Name != "planex-tenants" {
		t.Fatalf("tenants volume %s, ConfigMap %v", jsonOf(v), cm)
	}
	var list []any
	if err := yaml.Unmarshal([]byte(cm.Data["tenants.yaml"]), &list); err != nil || list == nil || len(list) != 0 {
		t.Errorf("the component's tenants.yaml: want an empty list, got %v (%v)", list, err)
	}
	creds := volume(t, sup, "/etc/planex/tenant-credentials")
	if creds.Projected == nil || len(creds.Projected.Sources) != 1 {
		t.Fatalf("tenant credentials %s", jsonOf(creds))
	}
	src := creds.Projected.Sources[0].Secret
	if src == nil || src.Name != "planex-tenant-team-a-nats" || len(src.Items) != 1 || src.Items[0].Path != "team-a/supervisor.nk" {
		t.Errorf("tenant credentials source %s", jsonOf(src))
	}
}

// TestHelmTenantsNATS loads the bundled NATS of the two-team render with
// the Secrets `planex auth k8s-secrets --tenant` generates in place of
// its mounts, starts it, and follows every NATS seed a pod of the render
// mounts to the NATS user it is: each tenant's pool is its tenant's
// executor-<pool> in account planex-tenant-<tenant>, the supervisor's
// tenant seeds are each tenant's supervisor there, the default tenant's
// services are in no tenant's account, and every tenant account has
// JetStream.
func TestHelmTenantsNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the tenants NATS test (builds planex, starts NATS)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := renderTenants(t, HelmOptions{Namespace: "planex"})
	gen := exec.CommandContext(ctx, buildPlanex(t), "auth", "k8s-secrets", "--namespace", "planex", "--pools", "sql,email,search",
		"--tenant", "team-a=sql", "--tenant", "team-b=search,email", "--out-dir", t.TempDir())
	var stderr strings.Builder
	gen.Stderr = &stderr
	secretYAML, err := gen.Output()
	if err != nil {
		t.Fatalf("planex auth k8s-secrets --tenant: %v\n%s", err, stderr.String())
	}
	secrets, err := Decode(secretYAML, "planex")
	if err != nil {
		t.Fatalf("decode the generated Secrets: %v", err)
	}
	for i, s := range secrets {
		if s.Name == "planex-tenant-team-b-nats" {
			// ci/values-tenants.yaml names team-b's Secret itself
			// (natsSecret): the operator stored the generated one so.
			secrets[i].Name = tenantSecrets["team-b"]
		}
	}
	r.Objects = append(r.Objects, secrets...)
	opts := natsSecurity(t, r)

	// Which generated seed each public nkey is: "<Secret>/<key>".
	seedOf := map[string]string{}
	for _, o := range secrets {
		sec, ok := o.Obj.(*corev1.Secret)
		if !ok {
			continue
		}
		for k, v := range sec.Data {
			if kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(v)))); err == nil {
				pub, _ := kp.PublicKey()
				seedOf[pub] = o.Name + "/" + k
			}
		}
	}

	// The NATS user of every seed file a pod mounts.
	accountOf := map[string]string{} // public nkey → account
	for _, u := range opts.Nkeys {
		acc := "$G"
		if u.Account != nil {
			acc = u.Account.Name
		}
		accountOf[u.Nkey] = acc
	}
	seedAccounts := func(w Workload, mountPath string) map[string]string { // file → account
		t.Helper()
		spec := w.Template.Spec
		dir := t.TempDir()
		for _, vm := range spec.Containers[0].VolumeMounts {
			if vm.MountPath != mountPath {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name != vm.Name {
					continue
				}
				if v.Projected != nil { // as the kubelet projects it
					for _, src := range v.Projected.Sources {
						writeSecretVolume(t, r, corev1.PodSpec{Volumes: []corev1.Volume{{Name: "p", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: src.Secret.Name, Items: src.Secret.Items, Optional: src.Secret.Optional}}}}}, corev1.VolumeMount{Name: "p"}, dir)
					}
				} else {
					writeSecretVolume(t, r, spec, vm, dir)
				}
			}
		}
		out := map[string]string{}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			seed, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
			if err != nil {
				return nil // not a seed (a credentials file, a certificate)
			}
			pub, _ := kp.PublicKey()
			rel, _ := filepath.Rel(dir, p)
			acc, ok := accountOf[pub]
			if !ok {
				acc = "<no NATS user>"
			}
			out[rel] = acc + " " + seedOf[pub]
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, w := range r.Workloads() {
		name := w.Template.Labels["app.kubernetes.io/name"]
		if w.Template.Labels["planex.dev/service"] != "true" {
			continue
		}
		got := seedAccounts(w, "/etc/planex/nats")
		if len(got) != 1 {
			t.Errorf("%s: /etc/planex/nats holds seeds %v, want one nkey", name, got)
			continue
		}
		acc, seed, _ := strings.Cut(got["nkey"], " ")
		if tp, ok := tenantPools[name]; ok {
			if want := "planex-tenant-" + tp.tenant + " " + tp.secret + "/executor-" + tp.pool + ".nk"; got["nkey"] != want {
				t.Errorf("%s: its nkey is %q (account, seed), want %q", name, got["nkey"], want)
			}
		} else if strings.HasPrefix(acc, "planex-tenant-") || acc == "<no NATS user>" || !strings.HasPrefix(seed, "planex-nats-") {
			t.Errorf("%s: its nkey is %q (account, seed), want a default tenant's identity", name, got["nkey"])
		}
		if name == "planex-supervisor" {
			got := seedAccounts(w, "/etc/planex/tenant-credentials")
			want := map[string]string{"team-a/supervisor.nk": "planex-tenant-team-a planex-tenant-team-a-nats/supervisor.nk",
				"team-b/supervisor.nk": "planex-tenant-team-b team-b-nats-seeds/supervisor.nk"}
			if !maps.Equal(got, want) {
				t.Errorf("supervisor tenant credentials: seeds of %v, want %v", got, want)
			}
		}
	}

	// The server runs that configuration, and each tenant has JetStream.
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir, opts.PidFile, opts.NoSigs = t.TempDir(), "", true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server with the rendered configuration and tenants: %v", err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	for _, tn := range []string{"team-a", "team-b"} {
		acc, err := s.LookupAccount("planex-tenant-" + tn)
		if err != nil {
			t.Fatalf("account of %s: %v", tn, err)
		}
		if !acc.JetStreamEnabled() {
			t.Errorf("account planex-tenant-%s has no JetStream", tn)
		}
	}
}

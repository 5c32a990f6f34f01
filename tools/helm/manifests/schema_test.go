package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"sigs.k8s.io/yaml"
)

// TestHelmSchemaAcceptsCIValues renders the default values and every
// ci/values-*.yaml (so a new file is covered without editing this test)
// with the chart's values.schema.json in force, and lints the chart
// strictly like .ci/run.
func TestHelmSchemaAcceptsCIValues(t *testing.T) {
	dir := chartDir(t)
	if _, err := os.Stat(filepath.Join(dir, "values.schema.json")); err != nil {
		t.Fatalf("the chart has no schema: %v", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "ci", "values-*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci/values-*.yaml in %s: %v", dir, err)
	}
	for _, f := range append([]string{""}, files...) {
		name := "default"
		var vf []string
		if f != "" {
			name, vf = filepath.Base(f), []string{f}
		}
		t.Run(name, func(t *testing.T) {
			if _, err := HelmTemplate(dir, "agents", vf...); err != nil {
				t.Fatal(err)
			}
		})
	}

	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = "planex"
	res := lint.Run([]string{dir}, map[string]any{})
	for _, m := range res.Messages {
		t.Logf("lint: %s", m)
	}
	if len(res.Errors) > 0 {
		t.Errorf("helm lint --strict: %v", res.Errors)
	}
}

// TestHelmSchemaRejects proves the schema fails closed: a wrong type, a
// value outside an enum and a misspelt key at a closed level each stop the
// render with an error naming the field.
func TestHelmSchemaRejects(t *testing.T) {
	dir := chartDir(t)
	cases := []struct {
		name, values string
		// want are substrings of the error: the field's path and why.
		want []string
	}{
		{"replicas as a string", "supervisor: {replicas: two}", []string{"/supervisor/replicas", "got string, want integer"}},
		{"negative replicas", "planner: {replicas: -1}", []string{"/planner/replicas", "minimum"}},
		{"misspelt key", "supervisor: {replicaz: 2}", []string{"/supervisor", "replicaz"}},
		{"misspelt top-level key", "supervisr: {replicas: 2}", []string{"additional properties 'supervisr' not allowed"}},
		{"unknown executor pool", "executors: {ftp: {enabled: true}}", []string{"/executors", "ftp"}},
		{"misspelt executor key", "executors: {sql: {maxAckPendng: 10}}", []string{"/executors/sql", "maxAckPendng"}},
		{"misspelt autoscaling key", "executors: {email: {autoscaling: {maxReplica: 3}}}", []string{"/executors/email/autoscaling", "maxReplica"}},
		{"starttls outside the enum", "executors: {email: {starttls: always}}", []string{"/executors/email/starttls", "mandatory"}},
		{"planner backend outside the enum", "planner: {backend: gpt}", []string{"/planner/backend", "playbook"}},
		{"log level outside the enum", "common: {logLevel: verbose}", []string{"/common/logLevel"}},
		{"duration without a unit", "common: {shutdownGrace: \"10\"}", []string{"/common/shutdownGrace"}},
		{"bad digest", "image: {digest: \"sha256:xyz\"}", []string{"/image/digest"}},
		{"pull policy outside the enum", "image: {pullPolicy: Sometimes}", []string{"/image/pullPolicy"}},
		{"issuer kind outside the enum", "security: {tls: {certManager: {issuerRef: {name: ca, kind: Foo}}}}", []string{"/security/tls/certManager/issuerRef/kind"}},
		{"insecurePlaintext as a string", "security: {insecurePlaintext: \"false\"}", []string{"/security/insecurePlaintext", "want boolean"}},
		{"port as a string", "otlp: {ports: [\"4317\"]}", []string{"/otlp/ports/0", "want integer"}},
		{"port out of range", "mcp: {egressPorts: [70000]}", []string{"/mcp/egressPorts/0", "maximum"}},
		{"extraEnv value an object", "common: {extraEnv: {PLANEX_X: {a: b}}}", []string{"/common/extraEnv/PLANEX_X"}},
		{"extraEnv bad variable name", "planner: {extraEnv: {\"not-a-var\": x}}", []string{"/planner/extraEnv", "not-a-var"}},
		{"playbook file name with a slash", "planner: {playbookFiles: {\"a/b.yaml\": x}}", []string{"/planner/playbookFiles", "a/b.yaml"}},
		{"external NATS without a URL", "nats: {bundled: false}", []string{"/nats/external"}},
		{"resources quantity malformed", "supervisor: {resources: {limits: {cpu: lots}}}", []string{"/supervisor/resources/limits/cpu"}},
		{"cpu target above 100", "executors: {sql: {autoscaling: {cpu: 150}}}", []string{"/executors/sql/autoscaling/cpu", "maximum"}},
		{"misspelt knob", "planner: {nodeSelecter: {pool: a}}", []string{"/planner", "nodeSelecter"}},
		{"misspelt defaults knob", "defaults: {podLabel: {a: b}}", []string{"/defaults", "podLabel"}},
		{"nodeSelector value a number", "defaults: {nodeSelector: {pool: 1}}", []string{"/defaults/nodeSelector/pool", "want string"}},
		{"podLabels a list", "nats: {podLabels: [a]}", []string{"/nats/podLabels", "want object"}},
		{"toleration operator outside the enum", "executors: {sql: {tolerations: [{key: a, operator: Is}]}}", []string{"/executors/sql/tolerations/0/operator"}},
		{"misspelt affinity key", "console: {affinity: {podAntiAffinty: {}}}", []string{"/console/affinity", "podAntiAffinty"}},
		{"spread without topologyKey", "mcp: {topologySpreadConstraints: [{maxSkew: 1, whenUnsatisfiable: DoNotSchedule}]}", []string{"/mcp/topologySpreadConstraints/0", "topologyKey"}},
		{"priorityClassName not a name", "supervisor: {priorityClassName: High_Priority}", []string{"/supervisor/priorityClassName"}},
		{"serviceAccount.create a string", "defaults: {serviceAccount: {create: \"no\"}}", []string{"/defaults/serviceAccount/create", "want boolean"}},
		{"serviceAccount annotation a number", "supervisor: {serviceAccount: {annotations: {a: 1}}}", []string{"/supervisor/serviceAccount/annotations/a"}},
		{"pdb minAvailable malformed", "planner: {podDisruptionBudget: {minAvailable: half}}", []string{"/planner/podDisruptionBudget/minAvailable"}},
		{"misspelt pdb key", "defaults: {podDisruptionBudget: {maxUnavailble: 1}}", []string{"/defaults/podDisruptionBudget", "maxUnavailble"}},
		{"strategy type outside the enum", "executors: {email: {strategy: {type: BlueGreen}}}", []string{"/executors/email/strategy/type"}},
		{"credentials of an unknown service", "nats: {external: {credentials: {executor-ftp: {secretName: x}}}}", []string{"/nats/external/credentials", "executor-ftp"}},
		{"credentials without a Secret", "nats: {external: {credentials: {supervisor: {key: creds}}}}", []string{"/nats/external/credentials/supervisor", "secretName"}},
		{"NATS CA misspelt", "nats: {external: {ca: {secret: x}}}", []string{"/nats/external/ca", "secret"}},
		{"KEDA endpoint a URL", "keda: {natsMonitoringEndpoint: \"http://nats:8222\"}", []string{"/keda/natsMonitoringEndpoint"}},
		{"console port a string", "console: {port: \"7480\"}", []string{"/console/port", "want integer"}},
		{"console without ingress peers", "console: {networkPolicy: {ingressFrom: []}}", []string{"/console/networkPolicy/ingressFrom", "minItems"}},
		{"console allowed host a URL", "console: {allowedHosts: [\"https://planex.example.com/\"]}", []string{"/console/allowedHosts/0"}},
		{"pod security level outside the enum", "namespace: {podSecurity: {enforce: strict}}", []string{"/namespace/podSecurity/enforce"}},
		{"namespace.create a string", "namespace: {create: \"yes\"}", []string{"/namespace/create", "want boolean"}},
		{"fullnameOverride with upper case", "fullnameOverride: Planex", []string{"/fullnameOverride"}},
		{"secret prefix with upper case", "security: {tls: {secretPrefix: Planex-}}", []string{"/security/tls/secretPrefix"}},
	}
	tmp := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := filepath.Join(tmp, strings.ReplaceAll(c.name, " ", "-")+".yaml")
			if err := os.WriteFile(f, []byte(c.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := HelmTemplate(dir, "agents", f)
			if err == nil {
				t.Fatalf("case %d: %q rendered; the schema should reject it", i, c.values)
			}
			if !strings.Contains(err.Error(), "schema") {
				t.Errorf("the render failed, but not on the schema: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestHelmSchemaOpenMaps proves the maps users extend stay open: extra
// resource names, arbitrary env variables, labels, playbook files, MCP
// server settings and Helm's global values render.
func TestHelmSchemaOpenMaps(t *testing.T) {
	dir := chartDir(t)
	f := filepath.Join(t.TempDir(), "values-open.yaml")
	values := `global: {imageRegistry: registry.example.com}
supervisor:
  resources:
    requests: {cpu: 0.5, memory: 1Gi, ephemeral-storage: 1Gi}
    limits: {cpu: 2, memory: 2Gi}
common:
  extraEnv: {PLANEX_ANYTHING: "x", OTEL_SERVICE_NAME: planex, PLANEX_NUMBER: 3, PLANEX_FLAG: true}
planner:
  playbookFiles: {a.yaml: "name: a", b.yml: "name: b"}
monitoring:
  podMonitor: {labels: {release: prom, team: agents}}
mcp:
  enabled: true
  resources: {requests: {cpu: 10m}}
  config:
    mcpServers:
      files: {command: npx, args: [-y, server-files], env: {ROOT: /data}, futureKey: 1}
nats:
  bundled: false
  external:
    url: tls://a.nats:4222,tls://b.nats:4222
    egressTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: messaging}}}]
`
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := HelmTemplate(dir, "agents", f); err != nil {
		t.Fatal(err)
	}
}

// TestHelmSchemaCoversValues walks values.yaml against the schema: every
// key is declared (by name, not only let through by an open map) and every
// leaf has a type, so no default value is unchecked.
func TestHelmSchemaCoversValues(t *testing.T) {
	dir := chartDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	defs, _ := schema["definitions"].(map[string]any)
	resolve := func(node map[string]any) map[string]any {
		for range 10 {
			ref, ok := node["$ref"].(string)
			if !ok {
				return node
			}
			def, ok := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
			if !ok {
				t.Fatalf("unresolved $ref %s", ref)
			}
			node = def
		}
		return node
	}
	typed := func(node map[string]any) bool {
		for _, k := range []string{"type", "enum", "const", "oneOf", "anyOf"} {
			if _, ok := node[k]; ok {
				return true
			}
		}
		return false
	}
	var walk func(path string, v any, node map[string]any)
	walk = func(path string, v any, node map[string]any) {
		node = resolve(node)
		if !typed(node) {
			t.Errorf("%s: the schema gives no type", path)
		}
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		props, _ := node["properties"].(map[string]any)
		if props == nil {
			// A map (extraEnv, labels, playbookFiles): its keys are the
			// user's, typed by additionalProperties or patternProperties.
			_, open := node["additionalProperties"].(map[string]any)
			_, patterned := node["patternProperties"].(map[string]any)
			if open || patterned || node["additionalProperties"] == nil {
				return
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			child, ok := props[k].(map[string]any)
			if !ok {
				t.Errorf("%s.%s: in values.yaml but not declared in values.schema.json", path, k)
				continue
			}
			walk(path+"."+k, m[k], child)
		}
	}
	walk("", vals, schema)
}

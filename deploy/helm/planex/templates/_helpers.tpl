{{/*
Names. planex.fullname follows the prometheus-community / nats-io rule:
fullnameOverride if set, else the release name when it contains "planex",
else "<release>-planex". planex.name maps the name an object has in a
release called "planex" (its historical name) to its name in this release:

  planex-supervisor -> <fullname>-supervisor
  planex            -> <fullname>
  nats, nats-headless, default-deny-all, ... -> unchanged when fullname is
                       "planex", else <fullname>-nats, <fullname>-nats-headless, ...

So `helm install planex` renders exactly the names of chart 0.1 (no renamed
StatefulSet or PVC on upgrade; the SANs of `planex auth k8s-secrets` still
match), and releases "a" and "b" in one namespace get a-planex-* and
b-planex-*. Call with (dict "root" $ "name" "planex-supervisor").
*/}}
{{- define "planex.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "planex" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-planex" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "planex.name" -}}
{{- $f := include "planex.fullname" .root -}}
{{- $n := .name -}}
{{- if eq $n "planex" -}}
{{- $f -}}
{{- else if hasPrefix "planex-" $n -}}
{{- printf "%s-%s" $f (trimPrefix "planex-" $n) | trunc 63 | trimSuffix "-" -}}
{{- else if eq $f "planex" -}}
{{- $n -}}
{{- else -}}
{{- printf "%s-%s" $f $n | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* The namespace every object lands in: namespaceOverride or the release's. */}}
{{- define "planex.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end }}

{{/* The bundled NATS' name (StatefulSet, client Service) and headless Service. */}}
{{- define "planex.natsName" -}}
{{- include "planex.name" (dict "root" . "name" "nats") -}}
{{- end }}

{{/*
Secret names. An empty value means the release's default, which for a
release named "planex" is what chart 0.1 used (planex-tls-<service>,
planex-nats-<service>, planex-step-signing, ...).
*/}}
{{- define "planex.tlsSecretPrefix" -}}
{{- .Values.security.tls.secretPrefix | default (printf "%s-tls-" (include "planex.fullname" .)) -}}
{{- end }}
{{- define "planex.natsSecretPrefix" -}}
{{- .Values.security.natsSecretPrefix | default (printf "%s-nats-" (include "planex.fullname" .)) -}}
{{- end }}
{{- define "planex.stepSigningSecret" -}}
{{- .Values.security.stepSigningSecret | default (include "planex.name" (dict "root" . "name" "planex-step-signing")) -}}
{{- end }}
{{- define "planex.stepVerifySecret" -}}
{{- .Values.security.stepVerifySecret | default (include "planex.name" (dict "root" . "name" "planex-step-verify")) -}}
{{- end }}
{{- define "planex.natsTLSSecret" -}}
{{- printf "%s-tls" (include "planex.natsName" .) -}}
{{- end }}
{{- define "planex.natsAuthSecret" -}}
{{- printf "%s-auth" (include "planex.natsName" .) -}}
{{- end }}

{{/*
Recommended labels of one object: name and component, plus the release.
Call with (dict "root" $ "name" "planex-planner" "component" "planner").
app.kubernetes.io/name is the component's historical name in every
release; app.kubernetes.io/instance tells releases apart.
*/}}
{{- define "planex.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: planex
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ get . "version" | default .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/*
Selector labels: the component and the release, so that two releases in
one namespace never select each other's pods. Call with
(dict "root" $ "name" "planex-planner").
*/}}
{{- define "planex.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* Metadata every object carries: namespace and labels (dict as planex.labels). */}}
{{- define "planex.metadata" -}}
namespace: {{ include "planex.namespace" .root }}
labels:
  {{- include "planex.labels" . | nindent 2 }}
{{- end }}

{{/* The planex image reference, pinned by tag or digest (the digest wins). */}}
{{- define "planex.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* Pod security context of every planex pod (restricted Pod Security). */}}
{{- define "planex.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container security context of every planex container. */}}
{{- define "planex.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
capabilities:
  drop: ["ALL"]
{{- end }}

{{/*
gRPC probes of a planex service on the plaintext health port 7410
(PLANEX_HEALTH_ADDR; the API port speaks TLS, which kubelet probes cannot).
The startup budget (150s) covers NATS connect (10s) plus JetStream set-up
(up to 2 minutes).
*/}}
{{- define "planex.probes" -}}
startupProbe:
  grpc:
    port: 7410
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 75
readinessProbe:
  grpc:
    port: 7410
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
livenessProbe:
  grpc:
    port: 7410
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 12
{{- end }}

{{/*
The chart's default spread of a Deployment's pods over nodes and zones, and
its soft anti-affinity; topologySpreadConstraints / affinity values replace
them. Call with (dict "root" $ "name" "planex-planner").
*/}}
{{- define "planex.defaultSpread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "planex.selectorLabels" . | nindent 6 }}
  matchLabelKeys: ["pod-template-hash"]
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "planex.selectorLabels" . | nindent 6 }}
  matchLabelKeys: ["pod-template-hash"]
{{- end }}
{{- define "planex.defaultAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "planex.selectorLabels" . | nindent 12 }}
{{- end }}

{{/*
The effective placement and metadata knobs of one workload, as YAML (read
it back with fromYaml). Call with (dict "root" $ "w" <the workload's values>).
A non-empty workload value replaces the defaults.<key> one for nodeSelector,
tolerations, affinity, topologySpreadConstraints, priorityClassName and
strategy; podLabels, podAnnotations and serviceAccount.annotations are
merged (the workload's keys win); serviceAccount.create and
podDisruptionBudget.enabled fall back to defaults when the workload does
not set them; a workload's minAvailable/maxUnavailable replace the defaults'
pair when it sets either. A StatefulSet ("statefulSet" true: NATS) takes
strategy (its updateStrategy) from its own values only: a Deployment
strategy is no StatefulSet updateStrategy.
*/}}
{{- define "planex.knobs" -}}
{{- $d := .root.Values.defaults | default dict -}}
{{- $w := .w | default dict -}}
{{- $out := dict -}}
{{- range $k := list "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "strategy" -}}
{{- $_ := set $out $k ((get $w $k) | default (get $d $k)) -}}
{{- end -}}
{{- if .statefulSet }}{{ $_ := set $out "strategy" ((get $w "strategy") | default dict) }}{{ end -}}
{{- range $k := list "podLabels" "podAnnotations" -}}
{{- $_ := set $out $k (merge (deepCopy ((get $w $k) | default dict)) (deepCopy ((get $d $k) | default dict))) -}}
{{- end -}}
{{- $wsa := (get $w "serviceAccount") | default dict -}}
{{- $dsa := (get $d "serviceAccount") | default dict -}}
{{- $create := true -}}
{{- if hasKey $wsa "create" }}{{ $create = $wsa.create }}{{ else if hasKey $dsa "create" }}{{ $create = $dsa.create }}{{ end -}}
{{- $_ := set $out "serviceAccount" (dict "create" $create "name" ((get $wsa "name") | default "") "annotations" (merge (deepCopy ((get $wsa "annotations") | default dict)) (deepCopy ((get $dsa "annotations") | default dict)))) -}}
{{- $wpdb := (get $w "podDisruptionBudget") | default dict -}}
{{- $dpdb := (get $d "podDisruptionBudget") | default dict -}}
{{- $enabled := true -}}
{{- if hasKey $wpdb "enabled" }}{{ $enabled = $wpdb.enabled }}{{ else if hasKey $dpdb "enabled" }}{{ $enabled = $dpdb.enabled }}{{ end -}}
{{- $src := dict -}}
{{- if or (ne (toString ((get $wpdb "minAvailable") | default "")) "") (ne (toString ((get $wpdb "maxUnavailable") | default "")) "") }}{{ $src = $wpdb }}{{ else }}{{ $src = $dpdb }}{{ end -}}
{{- $min := toString ((get $src "minAvailable") | default "") -}}
{{- $max := toString ((get $src "maxUnavailable") | default "") -}}
{{- if and (ne $min "") (ne $max "") }}{{ fail (printf "%s.podDisruptionBudget: set minAvailable or maxUnavailable, not both" .path) }}{{ end -}}
{{- $_ := set $out "podDisruptionBudget" (dict "enabled" $enabled "minAvailable" $min "maxUnavailable" $max) -}}
{{- toYaml $out -}}
{{- end }}

{{/*
Pod template metadata: the recommended labels, the workload's podLabels and
podAnnotations, plus the chart's annotations (checksums, scrape hints).
Call with (dict "root" $ "name" .. "component" .. "knobs" $k "extraLabels" dict "annotations" dict).
The chart's labels win over podLabels (selectors depend on them).
*/}}
{{- define "planex.podMetadata" -}}
{{- $labels := merge (include "planex.labels" . | fromYaml) (.extraLabels | default dict) (deepCopy .knobs.podLabels) -}}
{{- $annotations := merge (.annotations | default dict) (deepCopy .knobs.podAnnotations) -}}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Scheduling fields of a pod spec: priorityClassName, nodeSelector,
tolerations, affinity and topologySpreadConstraints from the knobs, or the
chart's defaults (defaultAffinity / defaultSpread, YAML strings; empty:
none). A topologySpreadConstraint without a labelSelector gets the
workload's selector (sel: its component and release), so it counts the
release's own pods only. Call with (dict "knobs" $k "sel" (dict "root" $
"name" ..) "defaultAffinity" ".." "defaultSpread" "..").
*/}}
{{- define "planex.scheduling" -}}
{{- $k := .knobs -}}
{{- with $k.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $k.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $k.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $k.affinity }}
affinity:
  {{- toYaml $k.affinity | nindent 2 }}
{{- else if .defaultAffinity }}
affinity:
  {{- .defaultAffinity | nindent 2 }}
{{- end }}
{{- if $k.topologySpreadConstraints }}
{{- $tsc := list }}
{{- range $c := $k.topologySpreadConstraints }}
{{- if and (not $c.labelSelector) $.sel }}
{{- $c = merge (dict "labelSelector" (dict "matchLabels" (include "planex.selectorLabels" $.sel | fromYaml))) $c }}
{{- end }}
{{- $tsc = append $tsc $c }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $tsc | nindent 2 }}
{{- else if .defaultSpread }}
topologySpreadConstraints:
  {{- .defaultSpread | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount of a workload (when knobs.serviceAccount.create) and its
name. Call with (dict "root" $ "name" <object name> "labels" <planex.labels dict> "knobs" $k).
*/}}
{{- define "planex.serviceAccount" -}}
{{- if .knobs.serviceAccount.create }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "planex.serviceAccountName" . }}
  {{- include "planex.metadata" .labels | nindent 2 }}
  {{- with .knobs.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
# planex never talks to the Kubernetes API.
automountServiceAccountToken: false
{{- end }}
{{- end }}
{{- define "planex.serviceAccountName" -}}
{{- if .knobs.serviceAccount.create -}}
{{- .knobs.serviceAccount.name | default .name -}}
{{- else -}}
{{- .knobs.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end }}

{{/*
A PodDisruptionBudget from the knobs, or with the chart's default
(defaultMin / defaultMax, one of them set). Call with (dict "root" $ "name"
<object name> "labels" <planex.labels dict> "knobs" $k "defaultMin" ".." "defaultMax" "..").
*/}}
{{- define "planex.pdb" -}}
{{- $p := .knobs.podDisruptionBudget -}}
{{- if $p.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  {{- include "planex.metadata" .labels | nindent 2 }}
spec:
  {{- if ne $p.minAvailable "" }}
  minAvailable: {{ if regexMatch "^[0-9]+$" $p.minAvailable }}{{ $p.minAvailable }}{{ else }}{{ $p.minAvailable | quote }}{{ end }}
  {{- else if ne $p.maxUnavailable "" }}
  maxUnavailable: {{ if regexMatch "^[0-9]+$" $p.maxUnavailable }}{{ $p.maxUnavailable }}{{ else }}{{ $p.maxUnavailable | quote }}{{ end }}
  {{- else if .defaultMin }}
  minAvailable: {{ .defaultMin }}
  {{- else }}
  maxUnavailable: {{ .defaultMax }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "planex.selectorLabels" (dict "root" .root "name" .labels.name) | nindent 6 }}
{{- end }}
{{- end }}

{{/*
The services that run, as a list of dicts: name is the historical name
(the app.kubernetes.io/name label), short the Secret suffix, values the
path of their values. Executors also carry key (their executors entry),
pool (what --pool they run), tenant ("" for the default tenant) and
tlsShort (the suffix of their TLS Secret: a tenant's pool shares the one
of its pool, executor-<pool>, which `planex auth k8s-secrets --pools`
issues). Two enabled entries of one tenant running one pool fail.
*/}}
{{- define "planex.services" -}}
{{- $v := .Values -}}
- {name: planex-supervisor, short: supervisor, component: supervisor, container: supervisor, pool: "", port: 7400, args: ["supervisor"], replicas: {{ $v.supervisor.replicas }}, values: supervisor}
- {name: planex-planner, short: planner, component: planner, container: planner, pool: "", port: 7401, args: ["planner"], replicas: {{ $v.planner.replicas }}, values: planner}
{{- $seen := dict }}
{{- range $key := include "planex.executorKeys" . | fromJsonArray }}
{{- $e := include "planex.executor" (dict "root" $ "key" $key) | fromYaml }}
{{- if $e.enabled }}
{{- $id := printf "%s/%s" ($e.tenant | default "default") $e.pool }}
{{- if hasKey $seen $id }}{{ fail (printf "executors.%s: tenant %s already runs pool %s (executors.%s): one Deployment per tenant and pool" $key ($e.tenant | default "default") $e.pool (get $seen $id)) }}{{ end }}
{{- $_ := set $seen $id $key }}
- {name: planex-executor-{{ $key }}, short: executor-{{ $key }}, tlsShort: executor-{{ $e.pool }}, component: executor, container: executor, port: 7402, pool: {{ $e.pool }}, key: {{ $key }}, tenant: {{ $e.tenant | default "" | quote }}, args: ["executor", "--pool={{ $e.pool }}"], replicas: {{ if and (eq $e.pool "search") $e.persistence.enabled }}1{{ else }}{{ $e.replicas }}{{ end }}, values: executors.{{ $key }}}
{{- end }}
{{- end }}
{{- end }}

{{/*
The keys of executors, as a JSON list: sql, email, search, then the
tenants' pools (any other key) in name order.
*/}}
{{- define "planex.executorKeys" -}}
{{- $std := list "sql" "email" "search" -}}
{{- $keys := $std -}}
{{- range $k := keys .Values.executors | sortAlpha -}}
{{- if not (has $k $std) }}{{ $keys = append $keys $k }}{{ end -}}
{{- end -}}
{{- toJson $keys -}}
{{- end }}

{{/*
The effective values of one executors entry, as YAML (read back with
fromYaml): sql, email and search are their own values with pool set to
their key; another key is a tenant's pool, its values over those of
executors.<pool> (but enabled, on unless it says otherwise, and tenant).
A pool with a tenant must name a tenant of .Values.tenants that lists the
pool in its pools. Call with (dict "root" $ "key" "team-a-sql").
*/}}
{{- define "planex.executor" -}}
{{- $v := .root.Values -}}
{{- $std := list "sql" "email" "search" -}}
{{- $e := deepCopy ((index $v.executors .key) | default dict) -}}
{{- if has .key $std -}}
{{- $_ := set $e "pool" .key -}}
{{- else -}}
{{- if eq .key "mcp" }}{{ fail "executors.mcp: the MCP pool is configured under mcp, not executors" }}{{ end -}}
{{- if not (has ($e.pool | default "") $std) }}{{ fail (printf "executors.%s.pool: want sql, email or search (a tenant's pool runs one of them)" .key) }}{{ end -}}
{{- if not $e.tenant }}{{ fail (printf "executors.%s.tenant is required: an executors key other than sql, email and search is a tenant's pool" .key) }}{{ end -}}
{{- $enabled := true -}}
{{- if hasKey $e "enabled" }}{{ $enabled = $e.enabled }}{{ end -}}
{{- $e = include "planex.overlay" (dict "base" (omit (index $v.executors $e.pool) "enabled" "tenant") "over" $e) | fromJson -}}
{{- $_ := set $e "enabled" $enabled -}}
{{- end -}}
{{- $_ := set $e "tenant" ($e.tenant | default "") -}}
{{- if and $e.enabled $e.tenant -}}
{{- $t := include "planex.tenant" (dict "root" .root "name" $e.tenant) | fromYaml -}}
{{- if not $t.name }}{{ fail (printf "executors.%s.tenant: %q is not in tenants" .key $e.tenant) }}{{ end -}}
{{- if not (has $e.pool ($t.pools | default list)) }}{{ fail (printf "executors.%s: tenant %s does not list pool %s in tenants[].pools (its NATS identity executor-%s exists only for the pools it lists)" .key $e.tenant $e.pool $e.pool) }}{{ end -}}
{{- end -}}
{{- toYaml $e -}}
{{- end }}

{{/*
over deep-merged onto base, as JSON: maps merge key by key, any other
value of over (false and 0 too, which sprig's merge would drop) replaces
base's. Call with (dict "base" dict "over" dict).
*/}}
{{- define "planex.overlay" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $o := .over -}}
{{- $b := get $out $k -}}
{{- if and (kindIs "map" $o) (kindIs "map" $b) -}}
{{- $_ := set $out $k (include "planex.overlay" (dict "base" $b "over" $o) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $o -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/* One tenant of .Values.tenants as YAML, or {} (dict "root" $ "name" "team-a"). */}}
{{- define "planex.tenant" -}}
{{- $out := dict -}}
{{- range $t := .root.Values.tenants | default list -}}
{{- if eq $t.name $.name }}{{ $out = $t }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/*
The Secret of a tenant's NATS nkey seeds (supervisor.nk,
executor-<pool>.nk): its natsSecret, else planex-tenant-<name>-nats as
`planex auth k8s-secrets --tenant` names it. Call with (dict "root" $
"name" "team-a").
*/}}
{{- define "planex.tenantNatsSecret" -}}
{{- $t := include "planex.tenant" . | fromYaml -}}
{{- $t.natsSecret | default (printf "planex-tenant-%s-nats" .name) -}}
{{- end }}

{{/*
Checks the tenants: unique names, never "default", and a NATS with nkey
users (a tenant is a NATS account of the bundled NATS' auth.conf, or of an
external NATS authenticating planex with nkeys): not under
security.insecurePlaintext, not with nats.external credentials files.
*/}}
{{- define "planex.tenants.check" -}}
{{- $seen := dict -}}
{{- range $i, $t := .Values.tenants | default list -}}
{{- if or (not $t.name) (eq $t.name "default") }}{{ fail (printf "tenants[%d].name %q: want a tenant other than default (the default tenant is the installation itself)" $i ($t.name | default "")) }}{{ end -}}
{{- if hasKey $seen $t.name }}{{ fail (printf "tenants[%d].name %q: also tenants[%d]" $i $t.name (get $seen $t.name)) }}{{ end -}}
{{- $_ := set $seen $t.name $i -}}
{{- end -}}
{{- if .Values.tenants -}}
{{- if .Values.security.insecurePlaintext }}{{ fail "tenants: each tenant is a NATS account with its own users, which needs NATS authentication: not with security.insecurePlaintext" }}{{ end -}}
{{- if eq (include "planex.natsAuthMode" .) "creds" }}{{ fail "tenants: the supervisor and the tenants' pools authenticate to a tenant's NATS account with nkeys (the tenant's Secret): not with nats.external.credentials or credentialsSecret" }}{{ end -}}
{{- end -}}
{{- end }}

{{/*
The tenants file the supervisor reads (--tenants-file): the tenants
without the chart's own key natsSecret.
*/}}
{{- define "planex.config.tenants" -}}
{{- $list := list -}}
{{- range $t := .Values.tenants | default list -}}
{{- $list = append $list (omit $t "natsSecret") -}}
{{- end -}}
tenants.yaml: |
  # Applied by the supervisor at start and whenever it changes
  # (--tenants-file); tenants not listed are left alone.
  {{- toYaml $list | nindent 2 }}
{{- end }}

{{/* The model price table (--model-prices). */}}
{{- define "planex.config.modelPrices" -}}
model-prices.json: {{ toPrettyJson .Values.modelPrices | quote }}
{{- end }}

{{/*
The NATS identities of the planex services that run (the Secret suffixes
of planex-nats-<short> and the keys of nats.external.credentials).
*/}}
{{- define "planex.natsIdentities" -}}
{{- $ids := list "supervisor" "planner" -}}
{{- range $pool := list "sql" "email" "search" -}}
{{- $e := index $.Values.executors $pool -}}
{{- if and $e.enabled (not $e.tenant) }}{{ $ids = append $ids (printf "executor-%s" $pool) }}{{ end -}}
{{- end -}}
{{- if (.Values.mcp | default dict).enabled }}{{ $ids = append $ids "executor-mcp" }}{{ end -}}
{{- toJson $ids -}}
{{- end }}

{{/*
How the services authenticate to NATS: "nkey" (per-service nkey Secrets,
bundled or external), "creds" (per-service or shared credentials files of
an external NATS). With nats.external.credentials set, every service that
runs needs its entry unless the shared credentialsSecret is the fallback.
*/}}
{{- define "planex.natsAuthMode" -}}
{{- $x := .Values.nats.external -}}
{{- if .Values.nats.bundled -}}
nkey
{{- else if $x.credentials -}}
{{- range $id := include "planex.natsIdentities" . | fromJsonArray -}}
{{- $c := (get $x.credentials $id) | default dict -}}
{{- if and (not $c.secretName) (not $x.credentialsSecret) -}}
{{- fail (printf "nats.external.credentials.%s.secretName is required: with per-service credentials every service needs its own (or set nats.external.credentialsSecret as the shared fallback, one identity)" $id) -}}
{{- end -}}
{{- end -}}
creds
{{- else if $x.credentialsSecret -}}
creds
{{- else -}}
nkey
{{- end -}}
{{- end }}

{{/*
The nats-creds volume of one service (short name): its nkey Secret, its own
credentials Secret, or the shared one; a tenant's pool (tenant and pool
set): key executor-<pool>.nk of the tenant's Secret, its identity in the
tenant's NATS account. Call with (dict "root" $ "id" "supervisor"), or
(dict "root" $ "id" "executor-team-a-sql" "tenant" "team-a" "pool" "sql").
*/}}
{{- define "planex.natsCredsVolume" -}}
{{- $v := .root.Values -}}
{{- $x := $v.nats.external -}}
{{- $c := dict -}}
{{- if and (not $v.nats.bundled) $x.credentials }}{{ $c = (get $x.credentials .id) | default dict }}{{ end -}}
- name: nats-creds
  secret:
    {{- if .tenant }}
    # Tenant {{ .tenant }}'s identity executor-{{ .pool }}: a user of its NATS
    # account (planex-tenant-{{ .tenant }}) only.
    secretName: {{ include "planex.tenantNatsSecret" (dict "root" .root "name" .tenant) }}
    items:
      - key: executor-{{ .pool }}.nk
        path: nkey
    {{- else if $c.secretName }}
    # This service's own NATS identity (nats.external.credentials.{{ .id }}).
    secretName: {{ $c.secretName }}
    items:
      - key: {{ $c.key | default "creds" }}
        path: creds
    {{- else if and (not $v.nats.bundled) $x.credentialsSecret }}
    # The shared credentials Secret: one NATS identity for every service.
    secretName: {{ $x.credentialsSecret }}
    {{- else }}
    secretName: {{ include "planex.natsSecretPrefix" .root }}{{ .id }}
    {{- end }}
    defaultMode: 0440
{{- end }}

{{/* The external NATS CA volume (nats.external.ca), if any. */}}
{{- define "planex.natsCAVolume" -}}
{{- $ca := .Values.nats.external.ca | default dict -}}
{{- if and (not .Values.nats.bundled) $ca.secretName }}
- name: nats-ca
  secret:
    secretName: {{ $ca.secretName }}
    items:
      - key: {{ $ca.key | default "ca.crt" }}
        path: ca.crt
    defaultMode: 0440
{{- end }}
{{- end }}
{{- define "planex.natsCAMount" -}}
{{- $ca := .Values.nats.external.ca | default dict -}}
{{- if and (not .Values.nats.bundled) $ca.secretName }}
- name: nats-ca
  mountPath: /etc/planex/nats-ca
  readOnly: true
{{- end }}
{{- end }}

{{/*
Rendered configuration (the data of each ConfigMap), shared by the
ConfigMaps and the checksum/config annotations: a change rolls exactly the
workloads that read it.
*/}}
{{- define "planex.config.common" -}}
{{- $insecure := .Values.security.insecurePlaintext -}}
{{- $x := .Values.nats.external -}}
PLANEX_NATS_URL: {{ if .Values.nats.bundled }}{{ if $insecure }}nats{{ else }}tls{{ end }}://{{ include "planex.natsName" . }}:4222{{ else }}{{ required "nats.external.url is required when nats.bundled is false" $x.url }}{{ end }}
PLANEX_HEALTH_ADDR: ":7410"
PLANEX_METRICS_ADDR: ":9090"
PLANEX_LOG_FORMAT: {{ .Values.common.logFormat | quote }}
PLANEX_LOG_LEVEL: {{ .Values.common.logLevel | quote }}
PLANEX_SHUTDOWN_GRACE: {{ .Values.common.shutdownGrace | quote }}
PLANEX_STREAM_REPLICAS: {{ .Values.common.streamReplicas | quote }}
PLANEX_JETSTREAM_MAX_BYTES: {{ .Values.common.jetstreamMaxBytes | quote }}
{{- if $insecure }}
PLANEX_PLAINTEXT: "true"
PLANEX_AUTH_DISABLED: "true"
PLANEX_ALLOW_UNSIGNED_STEPS: "true"
{{- else }}
PLANEX_TLS_CERT_FILE: /etc/planex/tls/tls.crt
PLANEX_TLS_KEY_FILE: /etc/planex/tls/tls.key
PLANEX_TLS_CA_FILE: /etc/planex/tls/ca.crt
{{- if and (not .Values.nats.bundled) ($x.ca | default dict).secretName }}
PLANEX_NATS_TLS_CA_FILE: /etc/planex/nats-ca/ca.crt
{{- else }}
PLANEX_NATS_TLS_CA_FILE: /etc/planex/tls/ca.crt
{{- end }}
{{- if eq (include "planex.natsAuthMode" .) "creds" }}
PLANEX_NATS_CREDS_FILE: /etc/planex/nats/creds
{{- else }}
PLANEX_NATS_NKEY_FILE: /etc/planex/nats/nkey
{{- end }}
{{- end }}
{{- with .Values.otlp.endpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ . | quote }}
{{- end }}
{{- range $k, $v := .Values.common.extraEnv }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}

{{- define "planex.config.planner" -}}
PLANEX_PLANNER_BACKEND: {{ .Values.planner.backend | quote }}
{{- $books := list }}
{{- with .Values.planner.playbooks }}{{ $books = append $books . }}{{ end }}
{{- if .Values.planner.playbookFiles }}{{ $books = append $books "/etc/planex/playbooks" }}{{ end }}
{{- if $books }}
PLANEX_PLAYBOOKS: {{ join "," $books | quote }}
{{- end }}
{{- range $k, $v := .Values.planner.extraEnv }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}

{{- define "planex.config.playbooks" -}}
{{- range $name, $body := .Values.planner.playbookFiles }}
{{ $name }}: |
  {{- $body | nindent 2 }}
{{- end }}
{{- end }}

{{/* An email pool's ConfigMap data; call with (dict "e" <its effective values>). */}}
{{- define "planex.config.email" -}}
allowed-domains: {{ join "," .e.allowedDomains | quote }}
from: {{ .e.from | quote }}
{{- end }}

{{/* An email pool's ConfigMap: planex-email for executors.email, planex-executor-<key>-email for a tenant's (dict "root" $ "key" ..). */}}
{{- define "planex.emailConfigName" -}}
{{- if eq .key "email" }}{{ include "planex.name" (dict "root" .root "name" "planex-email") }}{{ else }}{{ include "planex.name" (dict "root" .root "name" (printf "planex-executor-%s-email" .key)) }}{{ end -}}
{{- end }}

{{/* The checksum of the configuration a service reads (dict "root" $ "svc" $svc). */}}
{{- define "planex.config.checksum" -}}
{{- $root := .root -}}
{{- $c := include "planex.config.common" $root -}}
{{- if eq .svc.component "planner" }}{{ $c = print $c (include "planex.config.planner" $root) (include "planex.config.playbooks" $root) }}{{ end -}}
{{- if eq .svc.pool "email" }}{{ $c = print $c (include "planex.config.email" (dict "e" (include "planex.executor" (dict "root" $root "key" .svc.key) | fromYaml))) }}{{ end -}}
{{- if and (eq .svc.component "supervisor") $root.Values.modelPrices }}{{ $c = print $c (include "planex.config.modelPrices" $root) }}{{ end -}}
{{- $c | sha256sum -}}
{{- end }}

{{/* nats.conf of the bundled NATS (ConfigMap <nats>-config). */}}
{{- define "planex.config.nats" -}}
{{- $n := .Values.nats -}}
{{- $nats := include "planex.natsName" . -}}
{{- $insecure := .Values.security.insecurePlaintext -}}
# NATS JetStream cluster (StatefulSet "{{ $nats }}", headless Service
# "{{ $nats }}-headless"). $SERVER_NAME is the pod name.
server_name: $SERVER_NAME
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
{{- if not $insecure }}
# Clients over TLS (Secret {{ include "planex.natsTLSSecret" . }}) and one nkey user per planex
# service with its least-privilege permissions (Secret {{ include "planex.natsAuthSecret" . }}, from
# `planex auth k8s-secrets`).
tls {
  cert_file: /etc/nats-tls/tls.crt
  key_file: /etc/nats-tls/tls.key
  ca_file: /etc/nats-tls/ca.crt
  timeout: 2
}
include ../nats-auth/auth.conf
{{- end }}
pid_file: /var/run/nats/nats.pid
lame_duck_grace_period: 10s
lame_duck_duration: 30s
max_payload: 1MB
jetstream {
  store_dir: /data
  max_file_store: {{ $n.maxFileStore }}
  max_memory_store: 256Mi
}
{{- if gt (int $n.replicas) 1 }}
cluster {
  name: planex
  listen: 0.0.0.0:6222
  no_advertise: true
  routes: [
    {{- range $i := until (int $n.replicas) }}
    {{ if $insecure }}nats{{ else }}tls{{ end }}://{{ $nats }}-{{ $i }}.{{ $nats }}-headless:6222
    {{- end }}
  ]
  connect_retries: 120
  {{- if not $insecure }}
  tls {
    cert_file: /etc/nats-tls/tls.crt
    key_file: /etc/nats-tls/tls.key
    ca_file: /etc/nats-tls/ca.crt
    verify: true
    timeout: 2
  }
  {{- end }}
}
{{- end }}
{{- end }}

{{/*
The NATS monitoring endpoint (host:port) KEDA polls: keda.natsMonitoringEndpoint,
else the bundled NATS' headless Service. With an external NATS the value
is required (the chart cannot know where its monitoring port is).
*/}}
{{- define "planex.kedaNatsEndpoint" -}}
{{- if .Values.keda.natsMonitoringEndpoint -}}
{{- .Values.keda.natsMonitoringEndpoint -}}
{{- else if .Values.nats.bundled -}}
{{- printf "%s-headless.%s.svc.%s:8222" (include "planex.natsName" .) (include "planex.namespace" .) .Values.clusterDomain -}}
{{- else -}}
{{- fail "keda.natsMonitoringEndpoint is required when keda.enabled and nats.bundled is false: the host:port of the external NATS servers' monitoring endpoint (the chart's own NATS does not run)" -}}
{{- end -}}
{{- end }}

{{/*
The Secret of the webhook secrets (supervisor.webhook.secretsSecret): the
operator's, one key per trigger's webhook.secret_ref; required with
supervisor.webhook.enabled (without it every webhook would answer 401).
*/}}
{{- define "planex.webhookSecretsSecret" -}}
{{- required "supervisor.webhook.secretsSecret is required with supervisor.webhook.enabled: the name of an existing Secret with one key per trigger's webhook.secret_ref (the chart never creates it)" .Values.supervisor.webhook.secretsSecret -}}
{{- end }}

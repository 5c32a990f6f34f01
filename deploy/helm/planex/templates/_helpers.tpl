{{/*
Recommended labels of one object: name and component, plus the release.
Call with (dict "root" $ "name" "planex-planner" "component" "planner").
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

{{/* The planex image reference, pinned by tag or digest. */}}
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

{{/* Spread and anti-affinity of a Deployment's pods. */}}
{{- define "planex.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        app.kubernetes.io/name: {{ . }}
    matchLabelKeys: ["pod-template-hash"]
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        app.kubernetes.io/name: {{ . }}
    matchLabelKeys: ["pod-template-hash"]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              app.kubernetes.io/name: {{ . }}
{{- end }}

{{/* The services that run, as a list of dicts. */}}
{{- define "planex.services" -}}
{{- $v := .Values -}}
- {name: planex-supervisor, component: supervisor, container: supervisor, pool: "", port: 7400, args: ["supervisor"], replicas: {{ $v.supervisor.replicas }}}
- {name: planex-planner, component: planner, container: planner, pool: "", port: 7401, args: ["planner"], replicas: {{ $v.planner.replicas }}}
{{- range $pool := list "sql" "email" "search" }}
{{- $e := index $v.executors $pool }}
{{- if $e.enabled }}
- {name: planex-executor-{{ $pool }}, component: executor, container: executor, port: 7402, pool: {{ $pool }}, args: ["executor", "--pool={{ $pool }}"], replicas: {{ if and (eq $pool "search") $e.persistence.enabled }}1{{ else }}{{ $e.replicas }}{{ end }}}
{{- end }}
{{- end }}
{{- end }}

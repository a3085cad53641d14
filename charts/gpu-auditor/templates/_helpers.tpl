{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpu-auditor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "gpu-auditor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-auditor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-auditor.labels" -}}
helm.sh/chart: {{ include "gpu-auditor.chart" . }}
{{ include "gpu-auditor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-auditor
{{- end }}

{{- define "gpu-auditor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-auditor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Operator pods (the node agent has its own component label). */}}
{{- define "gpu-auditor.operatorSelectorLabels" -}}
{{ include "gpu-auditor.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpu-auditor.agentSelectorLabels" -}}
{{ include "gpu-auditor.selectorLabels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "gpu-auditor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-auditor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-auditor.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "gpu-auditor.leaseName" -}}
{{- default (include "gpu-auditor.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The Leases the operator takes: its one, or one per shard (<lease>-shard-<i>, as the operator names them). */}}
{{- define "gpu-auditor.leaseNames" -}}
{{- $lease := include "gpu-auditor.leaseName" . }}
{{- $shards := int (dig "shards" 1 (.Values.operator | default dict)) }}
{{- if gt $shards 1 }}
{{- $names := list }}
{{- range $i := until $shards }}{{ $names = append $names (printf "%s-shard-%d" $lease $i) }}{{ end }}
{{- toJson $names }}
{{- else }}
{{- toJson (list $lease) }}
{{- end }}
{{- end }}

{{/* The gate's GateHolds object (read by its MutatingAdmissionPolicy, written by the operator). */}}
{{- define "gpu-auditor.holdsName" -}}
{{- printf "%s-holds" (include "gpu-auditor.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-auditor.pvcName" -}}
{{- default (printf "%s-data" (include "gpu-auditor.fullname" .)) .Values.store.sqlite.existingClaim }}
{{- end }}

{{- define "gpu-auditor.policiesConfigMap" -}}
{{- default (printf "%s-policies" (include "gpu-auditor.fullname" .)) .Values.policies.existingConfigMap }}
{{- end }}

{{/*
Replica count: explicit, else 2 with PostgreSQL (leader + standby) and 1 with SQLite. More than
one replica on SQLite is refused: the ReadWriteOnce volume cannot be shared and SQLite is not a
multi-writer store.
*/}}
{{- define "gpu-auditor.replicas" -}}
{{- $r := .Values.replicas }}
{{- if kindIs "invalid" $r }}
{{- if eq .Values.store.type "postgresql" }}2{{ else }}1{{ end }}
{{- else }}
{{- if and (eq .Values.store.type "sqlite") (gt (int $r) 1) }}
{{- fail (printf "replicas=%v needs store.type=postgresql: the SQLite store lives on a ReadWriteOnce volume that one pod at a time can use" $r) }}
{{- end }}
{{- int $r }}
{{- end }}
{{- end }}

{{/*
Secret references, as a list of {env, name, key}: each becomes an environment variable from a
Secret (never a Secret's value in a ConfigMap), and their names bound the operator's Secret
access (files/permissions.yaml, resourceNamesFrom: secretNames).
*/}}
{{- define "gpu-auditor.secretRefs" -}}
{{- $refs := list }}
{{- $v := .Values }}
{{- if $v.prometheus.bearerTokenSecret.name }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_PROMETHEUS_TOKEN" "name" $v.prometheus.bearerTokenSecret.name "key" $v.prometheus.bearerTokenSecret.key) }}
{{- end }}
{{- if $v.prometheus.basicAuthSecret.name }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_PROMETHEUS_USER" "name" $v.prometheus.basicAuthSecret.name "key" $v.prometheus.basicAuthSecret.usernameKey) }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_PROMETHEUS_PASSWORD" "name" $v.prometheus.basicAuthSecret.name "key" $v.prometheus.basicAuthSecret.passwordKey) }}
{{- end }}
{{- if eq $v.store.type "postgresql" }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_DATABASE_URL" "name" $v.store.postgresql.urlSecret.name "key" $v.store.postgresql.urlSecret.key) }}
{{- end }}
{{- if $v.notifications.slack.webhookUrlSecret.name }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_SLACK_WEBHOOK_URL" "name" $v.notifications.slack.webhookUrlSecret.name "key" $v.notifications.slack.webhookUrlSecret.key) }}
{{- end }}
{{- if $v.notifications.webhook.urlSecret.name }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_WEBHOOK_URL" "name" $v.notifications.webhook.urlSecret.name "key" $v.notifications.webhook.urlSecret.key) }}
{{- end }}
{{- if $v.notifications.webhook.hmacKeySecret.name }}
{{- $refs = append $refs (dict "env" "GPU_AUDITOR_WEBHOOK_HMAC_KEY" "name" $v.notifications.webhook.hmacKeySecret.name "key" $v.notifications.webhook.hmacKeySecret.key) }}
{{- end }}
{{- range $team := keys $v.notifications.routes | sortAlpha }}
{{- $route := get $v.notifications.routes $team }}
{{- $suffix := regexReplaceAll "[^A-Z0-9]" (upper $team) "_" }}
{{- with $route.slackWebhookUrlSecret }}
{{- $refs = append $refs (dict "env" (printf "GPU_AUDITOR_ROUTE_%s_SLACK_WEBHOOK_URL" $suffix) "name" .name "key" .key) }}
{{- end }}
{{- with $route.webhookUrlSecret }}
{{- $refs = append $refs (dict "env" (printf "GPU_AUDITOR_ROUTE_%s_WEBHOOK_URL" $suffix) "name" .name "key" .key) }}
{{- end }}
{{- end }}
{{- toJson $refs }}
{{- end }}

{{/* Whether a feature of files/permissions.yaml is enabled by these values. */}}
{{- define "gpu-auditor.featureEnabled" -}}
{{- $by := .feature.enabledBy }}
{{- if eq $by "always" }}true
{{- else if eq $by "requeue" }}{{ .values.requeue.enabled }}
{{- else if eq $by "gate" }}{{ .values.gate.enabled }}
{{- else if eq $by "gateHolds" }}{{ and .values.gate.enabled .values.gate.holdBeforeQuota.enabled }}
{{- else if hasKey .values.features $by }}{{ get .values.features $by }}
{{- else }}{{ fail (printf "files/permissions.yaml: feature enabledBy %q is not always, requeue, gate, gateHolds or a key of .Values.features" $by) }}
{{- end }}
{{- end }}

{{/*
RBAC rules of one scope (cluster or namespace) from files/permissions.yaml, as a YAML list.
resourceNamesFrom is replaced by the names it refers to; a rule left with no names is dropped
(an empty resourceNames would grant the verb on every object).
*/}}
{{- define "gpu-auditor.rules" -}}
{{- $root := .root }}
{{- $perm := $root.Files.Get "files/permissions.yaml" | fromYaml }}
{{- if or (not $perm) (hasKey $perm "Error") }}
{{- fail "files/permissions.yaml is missing or not valid YAML" }}
{{- end }}
{{- $secretNames := list }}
{{- range (include "gpu-auditor.secretRefs" $root | fromJsonArray) }}
{{- $secretNames = append $secretNames .name }}
{{- end }}
{{- $names := dict "leaseName" (include "gpu-auditor.leaseNames" $root | fromJsonArray) "secretNames" ($secretNames | uniq | sortAlpha) "holdsName" (list (include "gpu-auditor.holdsName" $root)) }}
{{- $rules := list }}
{{- range $fname := keys $perm.features | sortAlpha }}
{{- $f := get $perm.features $fname }}
{{- if and (eq $f.scope $.scope) (eq (include "gpu-auditor.featureEnabled" (dict "feature" $f "values" $root.Values)) "true") }}
{{- range $f.rules }}
{{- $rule := omit . "resourceNamesFrom" }}
{{- if .resourceNamesFrom }}
{{- if not (hasKey $names .resourceNamesFrom) }}
{{- fail (printf "files/permissions.yaml: unknown resourceNamesFrom %q" .resourceNamesFrom) }}
{{- end }}
{{- $rn := get $names .resourceNamesFrom }}
{{- if $rn }}
{{- $rules = append $rules (set $rule "resourceNames" $rn) }}
{{- end }}
{{- else }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $rules }}
{{- toYaml $rules }}
{{- end }}
{{- end }}

{{/* Seconds in a one-unit duration ("15s", "5m", "1h", "2d"); values.schema.json enforces the form. */}}
{{- define "gpu-auditor.seconds" -}}
{{- $n := regexFind "^[0-9]+" . | int }}
{{- $u := trimPrefix (toString $n) . }}
{{- $mult := get (dict "s" 1 "m" 60 "h" 3600 "d" 86400) $u }}
{{- if not $mult }}{{ fail (printf "duration %q: expected a number and one unit of s, m, h, d" .) }}{{ end }}
{{- mul $n $mult }}
{{- end }}

{{/*
One recording-rule expression: the 5-minute sum or count of a DCGM metric per pod and GPU.
Arguments: metric, fn (sum|count), convention (pod|exported_pod), clampMax/divide/step (for
GPU_UTIL: an integer percent with garbage values, clamped per sample through a subquery at the
scrape interval, then made a ratio); also: the metric's DCGM 4.6 name, read too (same field id,
same unit); when: a metric the GPU must also export for this one to be read (with clampMax, as
the selector becomes an expression). With honorLabels false the workload labels arrive as
exported_*: they are grouped on and renamed to pod/namespace/container, so recorded series always
look the same.
*/}}
{{- define "gpu-auditor.recordExpr" -}}
{{- $p := ternary "exported_" "" (eq .convention "exported_pod") }}
{{- $by := printf "%snamespace, %spod, %scontainer, UUID, GPU_I_ID, modelName" $p $p $p }}
{{- $sel := printf "%s{%spod!=\"\"}" .metric $p }}
{{- if .also }}
{{- $sel = printf "{__name__=~\"%s|%s\", %spod!=\"\"}" .metric .also $p }}
{{- end }}
{{- if .when }}
{{- $sel = printf "(%s and on (UUID) %s)" $sel .when }}
{{- end }}
{{- $inner := "" }}
{{- if .clampMax }}
{{- $inner = printf "%s_over_time(clamp_max(%s, %v)[5m:%s])" .fn $sel .clampMax .step }}
{{- else }}
{{- $inner = printf "%s_over_time(%s[5m])" .fn $sel }}
{{- end }}
{{- $expr := printf "sum by (%s) (%s)" $by $inner }}
{{- if $p }}
{{- $expr = printf "sum without (exported_namespace, exported_pod, exported_container) (label_replace(label_replace(label_replace(%s, \"namespace\", \"$1\", \"exported_namespace\", \"(.*)\"), \"pod\", \"$1\", \"exported_pod\", \"(.*)\"), \"container\", \"$1\", \"exported_container\", \"(.*)\"))" $expr }}
{{- end }}
{{- if and .divide (eq .fn "sum") }}
{{- $expr = printf "%s / %v" $expr .divide }}
{{- end }}
{{- $expr }}
{{- end }}

{{- /* The extra labels of one Prometheus Operator object (ServiceMonitor, PrometheusRule): its own
  `labels` value plus `release: <kubePrometheusStack.release>` unless they set release themselves.
  kube-prometheus-stack's Prometheus selects these objects by that label and silently ignores the
  rest. Args: labels (a map or nil), root (the chart's top context). */}}
{{- define "gpu-auditor.monitorLabels" -}}
{{- $labels := deepCopy (.labels | default dict) }}
{{- $release := .root.Values.kubePrometheusStack.release }}
{{- if and $release (not (hasKey $labels "release")) }}
{{- $_ := set $labels "release" $release }}
{{- end }}
{{- with $labels }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* The chart's name, or nameOverride. */}}
{{- define "rls.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: fullnameOverride, else the release name, with the chart's name when it
does not already contain it ("rls" for release rls). */}}
{{- define "rls.fullname" -}}
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

{{- define "rls.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rls.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rls.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rls.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rls.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rls.configMapName" -}}
{{- default (printf "%s-config" (include "rls.fullname" .)) .Values.config.existingConfigMap }}
{{- end }}

{{/* The fewest replicas the Deployment runs: --min-fleet-size. */}}
{{- define "rls.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- max 1 (int .Values.autoscaling.minReplicas) }}
{{- else }}
{{- max 1 (int .Values.replicaCount) }}
{{- end }}
{{- end }}

{{/* The --store flag: memory, or redis with the topology of redis.mode (single: redis,
cluster: redis-cluster, sentinel: redis-sentinel). */}}
{{- define "rls.storeFlag" -}}
{{- if and (eq .Values.store "redis") (ne .Values.redis.mode "single") }}
{{- printf "redis-%s" .Values.redis.mode }}
{{- else }}
{{- .Values.store }}
{{- end }}
{{- end }}

{{/* Refuse values that would deploy something that does not do what it says. */}}
{{- define "rls.checkValues" -}}
{{- if not (has .Values.store (list "memory" "redis")) }}
{{- fail (printf "store %q: want memory or redis" .Values.store) }}
{{- end }}
{{- if eq .Values.store "memory" }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled with store: memory: each replica would count alone, so the limits would grow with the replicas; use store: redis" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "replicaCount %d with store: memory: each replica would count alone, %d times the limits; use store: redis" (int .Values.replicaCount) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- if and .Values.redis.existingSecret .Values.redis.password }}
{{- fail "redis.existingSecret and redis.password: set one (the chart creates a Secret only from redis.password)" }}
{{- end }}
{{- if and .Values.redis.existingSecretURLKey (not .Values.redis.existingSecret) }}
{{- fail "redis.existingSecretURLKey needs redis.existingSecret" }}
{{- end }}
{{- with .Values.globalLimits }}
{{- $url := or .url .existingSecret }}
{{- if and .region (ne $.Values.store "redis") }}
{{- fail "globalLimits.region needs store: redis: a region's replicas decide against one count" }}
{{- end }}
{{- if and .region (not $url) }}
{{- fail "globalLimits.region needs globalLimits.url or globalLimits.existingSecret: where regions exchange shares" }}
{{- end }}
{{- if and $url (not .region) }}
{{- fail "globalLimits.url or globalLimits.existingSecret needs globalLimits.region: the region this release decides for" }}
{{- end }}
{{- if and .url .existingSecret }}
{{- fail "globalLimits.url and globalLimits.existingSecret: set one" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas is more than autoscaling.maxReplicas" }}
{{- end }}
{{- end }}

{{/* The Secret holding Redis's password, when there is one. */}}
{{- define "rls.redisSecretName" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else if .Values.redis.password }}
{{- printf "%s-redis" (include "rls.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The scrape job of this release's targets, which the alert rules select: the Service's name (the
job the Prometheus Operator gives a ServiceMonitor's targets without jobLabel), or
prometheusRule.job.
*/}}
{{- define "rls.job" -}}
{{- default (include "rls.fullname" .) .Values.prometheusRule.job }}
{{- end }}

{{/*
GOMEMLIMIT for the container: goMemLimitPercent of resources.limits.memory,
in bytes, so the Go runtime collects harder before the kernel's OOM killer
acts. Empty (no variable) without a memory limit, with goMemLimitPercent 0,
or when extraEnv sets GOMEMLIMIT itself.
*/}}
{{- define "rls.goMemLimit" -}}
{{- $q := toString (dig "limits" "memory" "" (.Values.resources | default dict)) -}}
{{- $own := false -}}
{{- range .Values.extraEnv }}{{ if eq (toString .name) "GOMEMLIMIT" }}{{ $own = true }}{{ end }}{{ end -}}
{{- $pct := int (.Values.goMemLimitPercent | default 0) -}}
{{- if and $q (gt $pct 0) (not $own) -}}
{{- $num := $q -}}
{{- $unit := 1 -}}
{{- range $suffix, $m := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- if hasSuffix $suffix $q }}{{ $num = trimSuffix $suffix $q }}{{ $unit = $m }}{{ end -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+$" $num) -}}
{{- fail (printf "resources.limits.memory %q: goMemLimitPercent needs a whole number of bytes with an optional unit (Ki, Mi, Gi, Ti, k, M, G, T); set goMemLimitPercent: 0, or GOMEMLIMIT in extraEnv" $q) -}}
{{- end -}}
{{- div (mul (int64 $num) (int64 $unit) $pct) 100 -}}
{{- end -}}
{{- end }}

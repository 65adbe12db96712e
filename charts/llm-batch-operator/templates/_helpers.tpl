{{/* Common labels of every object the chart creates. */}}
{{- define "llm-batch-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Name prefix of the release's objects (at most 52 characters, so suffixes still fit 63). */}}
{{- define "llm-batch-operator.fullname" -}}
{{- if or (contains .Chart.Name .Release.Name) (contains "llmbatch" .Release.Name) -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* Selector labels of one component: include with (list $ "operator"). */}}
{{- define "llm-batch-operator.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Image reference of one component: include with (list $ .Values.operator.repository). */}}
{{- define "llm-batch-operator.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" $root.Values.image.registry (index . 1) (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end }}

{{- define "llm-batch-operator.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "llm-batch-operator.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- end }}

{{- define "llm-batch-operator.gatewayServiceAccount" -}}
{{- default (printf "%s-gateway" (include "llm-batch-operator.fullname" .)) .Values.gateway.serviceAccount.name -}}
{{- end }}

{{/* Pod-level security context: the restricted Pod Security Standard. */}}
{{- define "llm-batch-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security context: the restricted Pod Security Standard, read-only root. */}}
{{- define "llm-batch-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Environment both the operator and the gateway read. */}}
{{- define "llm-batch-operator.storeEnv" -}}
- name: LLMBATCH_STORE_URI
  value: {{ .Values.store.uri | quote }}
- name: TMPDIR
  value: /tmp
{{- end }}

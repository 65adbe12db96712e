{{/* The application's name: the chart's, or nameOverride. */}}
{{- define "llm-batch-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* Common labels of every object the chart creates (the Kubernetes recommended labels). */}}
{{- define "llm-batch-operator.labels" -}}
app.kubernetes.io/name: {{ include "llm-batch-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: llm-batch-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Name prefix of the release's objects (at most 52 characters, so suffixes still fit 63):
     fullnameOverride, else the release name when it already names the chart, else both. */}}
{{- define "llm-batch-operator.fullname" -}}
{{- $name := include "llm-batch-operator.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if or (contains $name .Release.Name) (contains "llmbatch" .Release.Name) -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* Selector labels of one component: include with (list $ "operator"). */}}
{{- define "llm-batch-operator.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "llm-batch-operator.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Labels of one component's pods: its podLabels under the chart's own. Include with
     (list $ "operator" .Values.operator.podLabels). */}}
{{- define "llm-batch-operator.podLabels" -}}
{{- $root := index . 0 -}}
{{- $own := include "llm-batch-operator.labels" $root | fromYaml -}}
{{- $_ := set $own "app.kubernetes.io/component" (index . 1) -}}
{{- toYaml (merge $own (index . 2 | default dict)) -}}
{{- end }}

{{/* Image reference of one component: include with (list $ REPOSITORY DIGEST); a digest pins
     `<registry>/<repository>@<digest>`, else the tag (image.tag, or the appVersion). */}}
{{- define "llm-batch-operator.image" -}}
{{- $root := index . 0 -}}
{{- $registry := required "image.registry is required: build and push the images first (make images images-push IMAGE_REGISTRY=<your registry>, docs/images.md) and set image.registry to that registry" $root.Values.image.registry -}}
{{- $repository := printf "%s/%s" (trimSuffix "/" $registry) (index . 1) -}}
{{- with index . 2 -}}
{{- printf "%s@%s" $repository . -}}
{{- else -}}
{{- printf "%s:%s" $repository (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}
{{- end }}

{{/* The store URI, required: no default store works in a cluster; with store.encryption's
     parameters (docs/storage.md#encryption). */}}
{{- define "llm-batch-operator.storeUri" -}}
{{- include "llm-batch-operator.encryptedUri" (list . (required "store.uri is required: the S3-compatible bucket every component shares, e.g. s3://my-bucket/llmbatch?region=eu-west-1 (docs/install.md#2-object-store-namespaces-and-credentials)" .Values.store.uri)) -}}
{{- end }}

{{/* The store URI executor pods use: store.executorUri (else store.uri), encrypted alike. */}}
{{- define "llm-batch-operator.executorStoreUri" -}}
{{- if .Values.store.executorUri -}}
{{- include "llm-batch-operator.encryptedUri" (list . .Values.store.executorUri) -}}
{{- else -}}
{{- include "llm-batch-operator.storeUri" . -}}
{{- end -}}
{{- end }}

{{/* A store URI with the sse / sse_kms_key_id parameters store.encryption asks for: include
     with (list $ URI). Every component opens the store from such a URI, so the operator, the
     gateway and executor pods all encrypt every write the same way. */}}
{{- define "llm-batch-operator.encryptedUri" -}}
{{- $root := index . 0 -}}
{{- $uri := index . 1 -}}
{{- $enc := $root.Values.store.encryption -}}
{{- if and $enc.kmsKeyID (ne $enc.mode "sse-kms") -}}
{{- fail "store.encryption.kmsKeyID needs store.encryption.mode sse-kms" -}}
{{- end -}}
{{- if not $enc.mode -}}
{{- $uri -}}
{{- else -}}
{{- if not (hasPrefix "s3://" $uri) -}}
{{- fail (printf "store.encryption.mode %s needs an s3:// store URI, not %s (a filesystem store writes its files 0600 instead)" $enc.mode $uri) -}}
{{- end -}}
{{- if regexMatch "[?&]sse(_kms_key_id)?=" $uri -}}
{{- fail "set encryption in store.encryption, not as sse / sse_kms_key_id parameters of the store URI" -}}
{{- end -}}
{{- $params := printf "sse=%s" (ternary "aws%3Akms" "AES256" (eq $enc.mode "sse-kms")) -}}
{{- if $enc.kmsKeyID -}}
{{- $params = printf "%s&sse_kms_key_id=%s" $params (urlquery $enc.kmsKeyID) -}}
{{- end -}}
{{- printf "%s%s%s" $uri (ternary "&" "?" (contains "?" $uri)) $params -}}
{{- end -}}
{{- end }}

{{/* TCP ports the object store listens on, one per line: networkPolicy.store.ports, else the
     port of the URIs' endpoint_url (80 for a plain http:// one), else 443. */}}
{{- define "llm-batch-operator.storePorts" -}}
{{- if .Values.networkPolicy.store.ports -}}
{{- range .Values.networkPolicy.store.ports }}
{{ . }}
{{- end -}}
{{- else -}}
{{- range $uri := list .Values.store.uri (default .Values.store.uri .Values.store.executorUri) | uniq }}
{{- $endpoint := regexReplaceAll "^.*[?&]endpoint_url=([^&]*).*$" (regexFind "[?&]endpoint_url=[^&]*" $uri) "${1}" | replace "%3A" ":" | replace "%3a" ":" | replace "%2F" "/" | replace "%2f" "/" }}
{{- $port := regexReplaceAll "^[a-z]+://[^/:]+:([0-9]+).*$" (regexFind "^[a-z]+://[^/:]+:[0-9]+" $endpoint) "${1}" }}
{{- if $port }}
{{ $port }}
{{- else if hasPrefix "http://" $endpoint }}
80
{{- else }}
443
{{- end }}
{{- end }}
{{- end -}}
{{- end }}

{{- define "llm-batch-operator.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "llm-batch-operator.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- end }}

{{- define "llm-batch-operator.gatewayServiceAccount" -}}
{{- default (printf "%s-gateway" (include "llm-batch-operator.fullname" .)) .Values.gateway.serviceAccount.name -}}
{{- end }}

{{/* What a component's pod spec takes from its values beside the containers: security
     context, priority class, placement and spread. Include with (list $ .Values.operator). */}}
{{- define "llm-batch-operator.podPlacement" -}}
{{- $component := index . 1 -}}
securityContext:
  {{- toYaml $component.podSecurityContext | nindent 2 }}
{{- with $component.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $component.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Environment both the operator and the gateway read. */}}
{{- define "llm-batch-operator.storeEnv" -}}
- name: LLMBATCH_STORE_URI
  value: {{ include "llm-batch-operator.storeUri" . | quote }}
- name: TMPDIR
  value: /tmp
{{- end }}

{{/* Store credentials: the keys of store.secretName as environment variables (boto3's chain). */}}
{{- define "llm-batch-operator.storeEnvFrom" -}}
{{- if .Values.store.secretName }}
envFrom:
  - secretRef:
      name: {{ .Values.store.secretName }}
{{- end }}
{{- end }}

{{/* "true" when the chart should install kopf's clusterkopfpeerings.kopf.dev CRD (crds.kopfPeering):
     `auto` skips it when it exists and another release (or no Helm release) owns it. */}}
{{- define "llm-batch-operator.installKopfPeeringCrd" -}}
{{- $mode := .Values.crds.kopfPeering -}}
{{- if eq $mode "always" -}}
true
{{- else if eq $mode "auto" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "clusterkopfpeerings.kopf.dev" -}}
{{- if not $crd -}}
true
{{- else if and (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $crd) .Release.Name) (eq (dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" $crd) .Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
{{- end }}

{{/* One NetworkPolicy rule: include with (list PEER_KEY PEERS TCP_PORTS [UDP_PORTS]), where
     PEER_KEY is "from" or "to" and empty PEERS mean any peer. */}}
{{- define "llm-batch-operator.policyRule" -}}
{{- $ports := list -}}
{{- range index . 2 }}{{ $ports = append $ports (dict "protocol" "TCP" "port" (int .)) }}{{ end -}}
{{- if gt (len .) 3 }}{{ range index . 3 }}{{ $ports = append $ports (dict "protocol" "UDP" "port" (int .)) }}{{ end }}{{ end -}}
{{- $rule := dict "ports" $ports -}}
{{- with index . 1 }}{{ $_ := set $rule (index $ 0) . }}{{ end -}}
{{- toYaml (list $rule) }}
{{- end }}

{{/* NetworkPolicy peers: PEERS when set, else every public address (include with (list $
     PEERS)): 0.0.0.0/0 and ::/0 except networkPolicy.nonPublic, so an empty list never opens
     the cluster's own networks, the node's metadata service or loopback. */}}
{{- define "llm-batch-operator.peersOrPublic" -}}
{{- $peers := index . 1 -}}
{{- if $peers -}}
{{- toJson $peers -}}
{{- else -}}
{{- $v4 := list -}}
{{- $v6 := list -}}
{{- range (index . 0).Values.networkPolicy.nonPublic -}}
{{- if contains ":" . }}{{ $v6 = append $v6 . }}{{ else }}{{ $v4 = append $v4 . }}{{ end -}}
{{- end -}}
{{- toJson (list (dict "ipBlock" (dict "cidr" "0.0.0.0/0" "except" $v4)) (dict "ipBlock" (dict "cidr" "::/0" "except" $v6))) -}}
{{- end -}}
{{- end }}

{{/* NetworkPolicy egress of every component: DNS and the object store (include with
     (list $ STORE_PORTS)). */}}
{{- define "llm-batch-operator.egressDnsAndStore" -}}
{{- $np := (index . 0).Values.networkPolicy -}}
{{- $store := include "llm-batch-operator.peersOrPublic" (list (index . 0) $np.store.to) | fromJsonArray -}}
{{ include "llm-batch-operator.policyRule" (list "to" $np.dnsTo (list 53) (list 53)) }}
{{ include "llm-batch-operator.policyRule" (list "to" $store (index . 1)) }}
{{- end }}

{{/* NetworkPolicy egress to the Kubernetes API server. */}}
{{- define "llm-batch-operator.egressApiServer" -}}
{{ include "llm-batch-operator.policyRule" (list "to" .Values.networkPolicy.apiServer.to .Values.networkPolicy.apiServer.ports) }}
{{- end }}

{{/*
The labels of every object. The first two are the deploy package's (the
selectors and the NetworkPolicy use them); the rest are Helm's, which
charts/chart_test.go ignores when it compares with the package.
*/}}
{{- define "layercache.labels" -}}
app.kubernetes.io/name: layercache
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{ include "layercache.helmLabels" .root }}
{{- end }}

{{- define "layercache.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The pods' labels and selectors: the package's, so an install can move between kubectl, kpt and Helm. */}}
{{- define "layercache.selector" -}}
app.kubernetes.io/name: layercache
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "layercache.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
layercache.flag renders "- --NAME=VALUE" for a value that is set, nothing
for null, so that an unset value leaves the binary's default. false and 0
are set values ("--gc-min-free-percent=0" disables eviction by free space).
*/}}
{{- define "layercache.flag" -}}
{{- $name := index . 0 }}{{ $value := index . 1 }}
{{- if not (kindIs "invalid" $value) }}
- --{{ $name }}={{ $value }}
{{- end }}
{{- end }}

{{/* The container fields the image and pull policy set. */}}
{{- define "layercache.imageFields" -}}
image: {{ include "layercache.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

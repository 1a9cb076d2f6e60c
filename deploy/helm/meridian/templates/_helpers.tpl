{{/* Names and labels shared by every template. */}}

{{- define "meridian.fullname" -}}
{{- if contains "meridian" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-meridian" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "meridian.labels" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
meridian.dev/region: {{ .Values.region | quote }}
{{- end -}}

{{/* Selector labels of one tier: call with (list $ "tier1"). */}}
{{- define "meridian.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "meridian.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "meridian.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "meridian.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "meridian.configMapName" -}}
{{- default (printf "%s-config" (include "meridian.fullname" .)) .Values.config.configMap.name -}}
{{- end -}}

{{/* The flags that name the configuration source. */}}
{{- define "meridian.configArgs" -}}
{{- if eq .Values.config.source "etcd" }}
{{- if not .Values.config.etcd.endpoints }}
{{- fail "config.etcd.endpoints is required with config.source=etcd" }}
{{- end }}
- --etcd={{ .Values.config.etcd.endpoints | join "," }}
{{- with .Values.config.etcd.prefix }}
- --prefix={{ . }}
{{- end }}
{{- /* The last-known-good copy survives container restarts, so a restart
while etcd is unreachable still serves. */}}
- --cache=/var/cache/meridian/config.json
{{- else if eq .Values.config.source "configMap" }}
- --config=/etc/meridian/config
{{- else if eq .Values.config.source "kubernetes" }}
{{- /* The objects of the release's namespace, through the service account. */}}
- --source=kubernetes
{{- else }}
{{- fail (printf "config.source must be configMap, etcd or kubernetes, not %q" .Values.config.source) }}
{{- end }}
{{- end -}}

{{/* Volume and mount of a configMap source (nothing for etcd). */}}
{{- define "meridian.configVolume" -}}
{{- if eq .Values.config.source "configMap" }}
- name: config
  configMap:
    name: {{ include "meridian.configMapName" . }}
    {{- if .Values.config.configMap.name }}
    {{- with .Values.config.configMap.items }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- else }}
    items:
      {{- range $path, $_ := .Values.config.configMap.files }}
      - key: {{ include "meridian.configKey" $path }}
        path: {{ $path }}
      {{- end }}
    {{- end }}
{{- end }}
{{- if eq .Values.config.source "etcd" }}
- name: cache
  emptyDir: {}
{{- end }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "meridian.configMount" -}}
{{- if eq .Values.config.source "configMap" }}
- name: config
  mountPath: /etc/meridian/config
  readOnly: true
{{- end }}
{{- if eq .Values.config.source "etcd" }}
- name: cache
  mountPath: /var/cache/meridian
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* A ConfigMap key for a relative path: keys cannot hold "/". */}}
{{- define "meridian.configKey" -}}
{{- . | replace "/" "." -}}
{{- end -}}

{{- define "meridian.podSecurity" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "meridian.serviceAccountName" . }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Pod annotations of one tier: call with (list $ .Values.tierN). */}}
{{- define "meridian.podAnnotations" -}}
{{- $ := index . 0 -}}
{{- $ann := dict -}}
{{- if and (eq $.Values.config.source "configMap") (not $.Values.config.configMap.name) -}}
{{- $_ := set $ann "checksum/config" (include (print $.Template.BasePath "/configmap.yaml") $ | sha256sum) -}}
{{- end -}}
{{- $ann = merge $ann (index . 1).podAnnotations -}}
{{- with $ann -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

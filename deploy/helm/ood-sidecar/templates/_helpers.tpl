{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "ood-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release>-<chart> unless the release already contains it. */}}
{{- define "ood-sidecar.fullname" -}}
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

{{- define "ood-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ood-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ood-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selects the worker pods only (not the retraining job's pods). */}}
{{- define "ood-sidecar.workerSelectorLabels" -}}
{{ include "ood-sidecar.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "ood-sidecar.labels" -}}
helm.sh/chart: {{ include "ood-sidecar.chart" . }}
{{ include "ood-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ood-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ood-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ood-sidecar.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret mounted at /run/secrets/sidecar, or "" when there is none. */}}
{{- define "ood-sidecar.secretName" -}}
{{- if .Values.existingSecret }}
{{- .Values.existingSecret }}
{{- else if .Values.secret.create }}
{{- printf "%s-secrets" (include "ood-sidecar.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret key that holds the embedding server's API key, or "" (see apiKeySecret). */}}
{{- define "ood-sidecar.apiKeySecret" -}}
{{- with .Values.embeddingServer }}
{{- if and .enabled .apiKeySecret.name }}
{{- .apiKeySecret.name }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when secret files are mounted at all. */}}
{{- define "ood-sidecar.hasSecrets" -}}
{{- if or (include "ood-sidecar.secretName" .) (include "ood-sidecar.apiKeySecret" .) }}true{{ end }}
{{- end }}

{{/* Directory the secret files are read from (sidecar.settings.DEFAULT_SECRETS_DIR). */}}
{{- define "ood-sidecar.secretsDir" -}}
/run/secrets/sidecar
{{- end }}

{{/* Where redis.tlsSecret is mounted (outside the secrets directory, whose every
<section>__<field> file is a setting). */}}
{{- define "ood-sidecar.redisTlsDir" -}}
/run/secrets/redis-tls
{{- end }}

{{/* Writable working directory (emptyDir; the root filesystem is read-only). The faust
data directory lives under /tmp, another emptyDir. */}}
{{- define "ood-sidecar.dataDir" -}}
/var/lib/ood-sidecar
{{- end }}

{{/* Environment shared by the worker and the retraining job. */}}
{{- define "ood-sidecar.env" -}}
# The root filesystem is read-only: caches under ~ (matplotlib, embeddings) go to /tmp.
- name: HOME
  value: /tmp
- name: SIDECAR_SECRETS_DIR
  value: {{ include "ood-sidecar.secretsDir" . | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes shared by the worker and the retraining job; call with
(dict "ctx" $ "tmpSizeLimit" SIZE), and "dsnSecret" (retraining.postgres.dsnSecret) for a
job that reads PostgreSQL: its keys join the secret files as postgres__dsn (and
postgres__password). */}}
{{- define "ood-sidecar.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .tmpSizeLimit }}
- name: data
  emptyDir:
    sizeLimit: {{ .ctx.Values.dataSizeLimit }}
{{- $secret := include "ood-sidecar.secretName" .ctx }}
{{- $apiKey := include "ood-sidecar.apiKeySecret" .ctx }}
{{- if or .dsnSecret $apiKey }}
{{- /* One directory for all: the settings read secret files from one place. */}}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      {{- with $secret }}
      - secret:
          name: {{ . }}
      {{- end }}
      {{- with .dsnSecret }}
      - secret:
          name: {{ .name }}
          items:
            - key: {{ .key }}
              path: postgres__dsn
            {{- if .passwordKey }}
            - key: {{ .passwordKey }}
              path: postgres__password
            {{- end }}
      {{- end }}
      {{- with $apiKey }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $.ctx.Values.embeddingServer.apiKeySecret.key }}
              path: embedding_server__api_key
      {{- end }}
{{- else }}
{{- with $secret }}
- name: secrets
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- with .ctx.Values.redis.tlsSecret }}
- name: redis-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "ood-sidecar.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: {{ include "ood-sidecar.dataDir" . }}
{{- if (include "ood-sidecar.hasSecrets" .) }}
- name: secrets
  mountPath: {{ include "ood-sidecar.secretsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.redis.tlsSecret }}
- name: redis-tls
  mountPath: {{ include "ood-sidecar.redisTlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- /*
A number as settings read it: an integral value without an exponent. Helm holds numbers
from values files as float64 and prints 1000000 as "1e+06", which an int setting refuses.
*/ -}}
{{- define "ood-sidecar.num" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end }}

{{- /* The CronJob's name: Kubernetes allows 52 characters (Job names get a suffix). */ -}}
{{- define "ood-sidecar.retrainName" -}}
{{- printf "%s-retrain" (include "ood-sidecar.fullname" . | trunc 44 | trimSuffix "-") }}
{{- end }}

{{/*
Expand the name of the chart.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
*/}}
{{- define "gpupulse.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name; release name is not repeated when it already contains the chart name.
*/}}
{{- define "gpupulse.fullname" -}}
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

{{/* Namespace of every namespaced object. */}}
{{- define "gpupulse.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "gpupulse.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; never used in selectors, which must stay immutable. */}}
{{- define "gpupulse.labels" -}}
helm.sh/chart: {{ include "gpupulse.chart" . }}
app.kubernetes.io/name: {{ include "gpupulse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpupulse
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpupulse.exporter.fullname" -}}
{{- printf "%s-exporter" (include "gpupulse.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpupulse.controller.fullname" -}}
{{- printf "%s-controller" (include "gpupulse.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpupulse.exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpupulse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end }}

{{- define "gpupulse.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpupulse.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "gpupulse.exporter.serviceAccountName" -}}
{{- if .Values.exporter.serviceAccount.create }}
{{- default (include "gpupulse.exporter.fullname" .) .Values.exporter.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.exporter.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpupulse.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "gpupulse.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference; a digest wins over a tag. */}}
{{- define "gpupulse.image" -}}
{{- $registry := .Values.image.registry -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s/%s@%s" $registry $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s/%s:%s" $registry $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end }}

{{/* Name of the Secret that holds the webhook bearer token. */}}
{{- define "gpupulse.controller.tokenSecretName" -}}
{{- if .Values.controller.auth.existingSecret }}
{{- .Values.controller.auth.existingSecret }}
{{- else }}
{{- printf "%s-token" (include "gpupulse.controller.fullname" .) }}
{{- end }}
{{- end }}

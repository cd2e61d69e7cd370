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

{{/* The image reference; a digest wins over a tag, global.imageRegistry over image.registry. */}}
{{- define "gpupulse.image" -}}
{{- $registry := .Values.image.registry -}}
{{- with (.Values.global).imageRegistry }}{{ $registry = . }}{{ end -}}
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

{{/* imagePullSecrets of every pod: global ones first, then the chart's, without repeats. */}}
{{- define "gpupulse.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- range (concat ((.Values.global).imagePullSecrets | default list) (.Values.imagePullSecrets | default list)) -}}
{{- $entry := . -}}
{{- if kindIs "string" . }}{{ $entry = dict "name" . }}{{ end -}}
{{- if not (has $entry $secrets) }}{{ $secrets = append $secrets $entry }}{{ end -}}
{{- end -}}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Service / pod label whose value the monitors turn into the job label. */}}
{{- define "gpupulse.jobLabelKey" -}}jobLabel{{- end }}

{{/* The exporter's Prometheus job and the rules' default selector of its series. */}}
{{- define "gpupulse.exporter.selector" -}}
{{- if .Values.prometheusRule.exporterSelector -}}
{{- .Values.prometheusRule.exporterSelector -}}
{{- else -}}
{{- printf "job=%q" .Values.exporter.jobName -}}
{{- end -}}
{{- end }}

{{/* Labels for the objects a Prometheus selects: monitoringLabels, then the object's own extras. */}}
{{- define "gpupulse.monitoringLabels" -}}
{{- $labels := merge (dict) (.extra | default dict) (.root.Values.monitoringLabels | default dict) -}}
{{- with $labels }}{{ toYaml . }}{{ end -}}
{{- end }}

{{/* One rule field with every install-time tunable token replaced; a token without a value fails. */}}
{{- define "gpupulse.rules.tune" -}}
{{- $text := toString .text -}}
{{- range $section, $values := .tokens -}}
{{- range $name, $value := $values -}}
{{- $s := toString $value -}}
{{- /* Helm reads every YAML number as a float64, which toString writes as 1e+07: whole numbers are
written as integers, as the rule generator writes them (PromQL reads both, the generated copy must match) */ -}}
{{- if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) -}}
{{- $s = printf "%d" (int64 $value) -}}
{{- end -}}
{{- $text = replace (printf "__gpupulse_%s__%s__" $section $name) $s $text -}}
{{- end -}}
{{- end -}}
{{- if contains "__gpupulse_" $text -}}
{{- fail (printf "prometheusRule: no value for a rule setting in %q (was a prometheusRule key set to null?)" $text) -}}
{{- end -}}
{{- $text -}}
{{- end }}

{{/* Namespaces that get an AlertmanagerConfig (and, if not the release's, a copy of the token
Secret), as a JSON list, from the Alertmanager's matcher strategy (docs/helm.md). */}}
{{- define "gpupulse.alertmanagerConfig.namespaces" -}}
{{- $amc := .Values.controller.alertmanagerConfig -}}
{{- $own := include "gpupulse.namespace" . -}}
{{- $out := list -}}
{{- if eq $amc.matcherStrategy "OnNamespaceExceptForAlertmanagerNamespace" -}}
{{- if not $amc.alertmanagerNamespace -}}
{{- fail "controller.alertmanagerConfig.matcherStrategy OnNamespaceExceptForAlertmanagerNamespace needs controller.alertmanagerConfig.alertmanagerNamespace" -}}
{{- end -}}
{{- $out = list $amc.alertmanagerNamespace -}}
{{- else if eq $amc.matcherStrategy "None" -}}
{{- $out = list $own -}}
{{- else -}}
{{- $out = list $own -}}
{{- /* "*" (every namespace) names no namespace an AlertmanagerConfig could live in */ -}}
{{- range ($amc.namespaces | default .Values.controller.scope.namespaces) -}}
{{- if and (ne . "*") (not (has . $out)) }}{{ $out = append $out . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/* The controller's grants that change workloads (restart: delete a pod, delete a JobSet's Jobs,
a Volcano RestartJob Command, a rollout restart), as a rule list: in a Role in each namespace of
controller.scope.namespaces, or in the ClusterRole with ["*"] (docs/rbac.md). */}}
{{- define "gpupulse.controller.workloadRules" -}}
# restart deletes controller-owned pods with a UID precondition
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete"]
# gang restart deletes a JobSet's child Jobs, or asks Volcano for a RestartJob Command
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["delete"]
- apiGroups: ["bus.volcano.sh"]
  resources: ["commands"]
  verbs: ["create"]
{{- if .Values.controller.rbac.rolloutRestart }}
# rollout restart patches the Deployment's pod template annotation
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES from a mapping: k=v pairs, comma separated, in key order. */}}
{{- define "gpupulse.otlpResourceAttributes" -}}
{{- $pairs := list -}}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%s" $k (toString $v)) }}{{ end -}}
{{- join "," $pairs -}}
{{- end }}

{{/*
An exporter probe as the values give it; its httpGet speaks HTTPS when the web config turns on TLS.
*/}}
{{- define "gpupulse.exporter.probe" -}}
{{- $probe := deepCopy .probe -}}
{{- if and .https $probe.httpGet -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}
{{/* The rule groups of files/rules with this release's tunables, as the items of a YAML list at
indentation 4: every rule (scope ""), or only those that run on the shards ("node") or in the global
layer ("fleet") under prometheusRule.sharding; a group left without rules is left out. */}}
{{- define "gpupulse.rules.groups" -}}
{{- $ := .root }}
{{- $scope := .scope }}
{{- $pr := $.Values.prometheusRule }}
{{- /* Every __gpupulse_<section>__<name>__ token of files/rules is replaced by its value here. */}}
{{- /* No release tag exists to pin to: the default is the runbooks of the main branch of .Chart.Home. */}}
{{- $runbook := $pr.runbookUrl | default (printf "%s/blob/main/docs/runbooks/" $.Chart.Home) }}
{{- $tokens := dict
  "thresholds" $pr.thresholds
  "windows" $pr.windows
  "for" $pr.for
  "cost" $pr.cost
  "selectors" (dict "exporter" (include "gpupulse.exporter.selector" $))
  "runbook" (dict "url_base" $runbook) }}
{{- $nodeKinds := list "node" "gpu" "exporter" }}
{{- range $path, $_ := $.Files.Glob "files/rules/*.rules.yaml" }}
{{- range $group := ($.Files.Get $path | fromYaml).groups }}
{{- $rules := list }}
{{- range $rule := $group.rules }}
{{- if or (not $scope) (eq $scope (required (printf "files/rules: rule %s of %s says nowhere where it runs" ($rule.record | default $rule.alert) $group.name) $rule.scope)) }}
{{- $out := dict "expr" (include "gpupulse.rules.tune" (dict "text" $rule.expr "tokens" $tokens)) }}
{{- $labels := dict }}
{{- range $k, $v := ($rule.labels | default dict) }}
{{- $_ := set $labels $k (include "gpupulse.rules.tune" (dict "text" $v "tokens" $tokens)) }}
{{- end }}
{{- if $rule.record }}
{{- $_ := set $out "record" $rule.record }}
{{- with $labels }}{{ $_ := set $out "labels" . }}{{ end }}
{{- $rules = append $rules $out }}
{{- else if not (index ($pr.disabled | default dict) $rule.alert) }}
{{- $_ := set $out "alert" $rule.alert }}
{{- $_ := set $out "for" (include "gpupulse.rules.tune" (dict "text" $rule.for "tokens" $tokens)) }}
{{- with $rule.keep_firing_for }}
{{- $_ := set $out "keep_firing_for" (include "gpupulse.rules.tune" (dict "text" . "tokens" $tokens)) }}
{{- end }}
{{- if and $pr.namespaceNodeAlerts (has $labels.target_kind $nodeKinds) }}
{{- $_ := set $labels "namespace" (include "gpupulse.namespace" $) }}
{{- end }}
{{- $_ := set $out "labels" (merge $labels ($pr.additionalRuleLabels | default dict)) }}
{{- $annotations := dict }}
{{- range $k, $v := $rule.annotations }}
{{- $_ := set $annotations $k (include "gpupulse.rules.tune" (dict "text" $v "tokens" $tokens)) }}
{{- end }}
{{- $_ := set $out "annotations" (merge $annotations ($pr.additionalRuleAnnotations | default dict)) }}
{{- $rules = append $rules $out }}
{{- end }}
{{- end }}
{{- end }}
{{- if $rules }}
    - name: {{ $group.name }}
      {{- with $group.interval }}
      interval: {{ include "gpupulse.rules.tune" (dict "text" . "tokens" $tokens) }}
      {{- end }}
      rules:
        {{- toYaml $rules | nindent 8 }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the exporter watches its node's pods (engines by annotation, training ranks' jobs, training
progress), "" when not: the RBAC, the token mount and the flags all follow this one answer.
*/}}
{{- define "gpupulse.exporter.watchesPods" -}}
{{- if or .Values.exporter.engines.discoverPods .Values.exporter.trainingRanks.podWatch .Values.exporter.trainingProgress.enabled }}true{{- end }}
{{- end }}

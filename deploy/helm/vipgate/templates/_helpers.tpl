{{/* The chart's name. */}}
{{- define "vipgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The base of every object name: the release name, or release-chart when the release name does not
contain the chart name.
*/}}
{{- define "vipgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Object names of the two components (also their ServiceAccounts). */}}
{{- define "vipgate.nodeName" -}}
{{- printf "%s-node" (include "vipgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "vipgate.controllerName" -}}
{{- printf "%s-controller" (include "vipgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{/* The gateways' ServiceAccount (gateway.rbac.create). */}}
{{- define "vipgate.gatewayName" -}}
{{- printf "%s-gateway" (include "vipgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select a component's pods; pass (dict "ctx" $ "component" "node"). */}}
{{- define "vipgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vipgate.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels on every object of a component. */}}
{{- define "vipgate.labels" -}}
{{ include "vipgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT when apiServer.host is set (env list entries, to be
indented by the caller): the API server without the "kubernetes" Service, which nothing programs
before vipgate runs.
*/}}
{{- define "vipgate.apiServerEnv" -}}
{{- if .Values.apiServer.host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | toString | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ required "apiServer.port is required with apiServer.host" .Values.apiServer.port | toString | quote }}
{{- end -}}
{{- end -}}

{{/* The container image. */}}
{{- define "vipgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

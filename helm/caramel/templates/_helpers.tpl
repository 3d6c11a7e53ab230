{{/* The chart's name, for the app.kubernetes.io/name label. */}}
{{- define "caramel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The release's base name: the release name, with the chart's name unless it holds it already. */}}
{{- define "caramel.fullname" -}}
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
{{- end }}

{{/* Name of the operator's Deployment, Service and RBAC objects. */}}
{{- define "caramel.operatorName" -}}
{{- printf "%s-operator" (include "caramel.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "caramel.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "caramel.labels" -}}
helm.sh/chart: {{ include "caramel.chart" . }}
app.kubernetes.io/name: {{ include "caramel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: caramel
{{- end }}

{{/*
Labels that select the operator's pod. Worker pods carry app.kubernetes.io/name=caramel too, and
app.kubernetes.io/instance=<job>: the component keeps them out even of a release named like a job.
*/}}
{{- define "caramel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "caramel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "caramel.operatorLabels" -}}
{{ include "caramel.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "caramel.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "caramel.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* The operator's image. */}}
{{- define "caramel.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end }}

{{/* The workers' image: that of the jobs that set no spec.image (CARAMEL_RUNTIME_IMAGE). */}}
{{- define "caramel.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) -}}
{{- end }}

{{/*
The GPU jobs' image (CARAMEL_GPU_RUNTIME_IMAGE); empty where gpuRuntimeImage.repository is.
*/}}
{{- define "caramel.gpuRuntimeImage" -}}
{{- with .Values.gpuRuntimeImage.repository -}}
{{- printf "%s:%s" . (default $.Chart.AppVersion $.Values.gpuRuntimeImage.tag) -}}
{{- end -}}
{{- end }}

{{/*
The namespaces the operator serves, comma-separated (CARAMEL_WATCH_NAMESPACES): empty, for all,
with rbac.scope=cluster; rbac.watchNamespaces or the release's namespace with rbac.scope=namespaced.
*/}}
{{- define "caramel.watchNamespaces" -}}
{{- if eq .Values.rbac.scope "namespaced" -}}
{{- .Values.rbac.watchNamespaces | default (list .Release.Namespace) | uniq | join "," -}}
{{- else if .Values.rbac.watchNamespaces -}}
{{- fail "rbac.watchNamespaces is only for rbac.scope=namespaced: with rbac.scope=cluster the operator serves every namespace" -}}
{{- end -}}
{{- end }}

{{/*
The operator's RBAC rules, by role, from files/rbac-rules.yaml, which `make rbac` generates from
caramel_operator.rbac, as it does manifests/rbac.yaml and manifests/namespaced/ (tests/operator/test_rbac.py
fails when a copy drifts; tests/operator/test_operator_permissions.py records what the operator uses):
- operator: what it does in the namespaces it serves, granted cluster-wide by a ClusterRole, or
  in each served namespace by a Role;
- crdRead: kopf watches CRDs, to notice the CaramelJob CRD being installed or upgraded while it runs;
- namespaceRead: kopf, confined to namespaces, lists them to learn which of the served ones exist;
- placementRead: R-Storm lists the nodes (the pods on them under the operator's pods rule,
  cluster-wide with rbac.scope=cluster).
Call with (list . "role").
*/}}
{{- define "caramel.rbacRules" -}}
{{- $root := index . 0 }}
{{- index ($root.Files.Get "files/rbac-rules.yaml" | fromYaml) (index . 1) | toYaml }}
{{- end }}

{{/*
The hardening of the operator's pods (its Deployment's and the uninstall hook's), which Pod
Security's "restricted" profile admits: the image runs as UID 10001 and writes only to /tmp.
*/}}
{{- define "caramel.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "caramel.containerSecurityContext" -}}
{{ include "caramel.podSecurityContext" . }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
{{- end }}

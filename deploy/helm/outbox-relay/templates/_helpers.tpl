{{- define "outbox-relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-relay.labels" -}}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "outbox-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outbox-relay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The drain timeout in seconds, from relay.drain-timeout (a Go duration in s or m). */}}
{{- define "outbox-relay.drainSeconds" -}}
{{- $d := index .Values.relay "drain-timeout" | default "30s" | toString -}}
{{- if not (regexMatch "^[0-9]+[sm]$" $d) -}}
{{- fail (printf "relay.drain-timeout: %q: give whole seconds or minutes, such as 20s or 2m (or set terminationGracePeriodSeconds)" $d) -}}
{{- end -}}
{{- if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | atoi) 60 }}{{- else -}}{{ trimSuffix "s" $d | atoi }}{{- end -}}
{{- end -}}

{{/*
The pod's securityContext: the values' podSecurityContext, with an fsGroup
(default: runAsGroup, else 65532). Kubernetes mounts Secret files as
root:fsGroup; with the chart's defaultMode 0440 only the relay's group can
read them, so the relay's "secret file is readable by other users" check
(world-readable, or group-readable by a group it is not in) stays quiet.
*/}}
{{- define "outbox-relay.podSecurityContext" -}}
{{- $podSecurity := deepCopy .Values.podSecurityContext }}
{{- $_ := set $podSecurity "fsGroup" ($podSecurity.fsGroup | default $podSecurity.runAsGroup | default 65532) }}
{{- toYaml $podSecurity }}
{{- end }}

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

{{/*
The most relays that still add a worker to some route: ceil(256 / w) for
the route with the fewest workers w. Each route's 256 key-hash lanes are
leased over the live relays, and a relay's worker i claims the lanes it
holds that are i modulo its workers; at this count every lane of that
route can have a worker to itself, and past 256 a relay holds no lane at
all. w is a route's own workers (config.routes[].workers), else
relay.workers, else the config file's workers, else 2 (the relay's
default; the environment, where relay.* goes, wins over the file).
*/}}
{{- define "outbox-relay.laneCeiling" -}}
{{- $default := index .Values.relay "workers" | default (dig "workers" 2 .Values.config) | int -}}
{{- $fewest := $default -}}
{{- range (dig "routes" (list) .Values.config) -}}
{{- $w := dig "workers" $default . | int -}}
{{- if lt $w $fewest }}{{ $fewest = $w }}{{ end -}}
{{- end -}}
{{- if lt $fewest 1 -}}
{{- fail (printf "workers: %d: a relay runs at least one worker" $fewest) -}}
{{- end -}}
{{- div (add 256 (sub $fewest 1)) $fewest -}}
{{- end -}}

{{/*
An autoscaler's bounds, checked, as "min max": at least one relay (none
would deliver nothing, and only running relays export the backlog that
would bring one back), a maximum no lower than the minimum and at most
256 (the lanes of a route; beyond, a relay holds none). An empty maximum
is outbox-relay.laneCeiling. Called with (dict "ctx" $ "min" ... "max"
... "minName" ... "maxName" ...), the names of the values for errors.
*/}}
{{- define "outbox-relay.replicaBounds" -}}
{{- $min := .min | toString -}}
{{- if not (regexMatch "^[0-9]+$" $min) -}}
{{- fail (printf "%s: %q is not a whole number of relays" .minName $min) -}}
{{- end -}}
{{- if lt (atoi $min) 1 -}}
{{- fail (printf "%s: %s: at least 1. With no relay running nothing is delivered, and the backlog metric that would start one again is exported by the relays themselves" .minName $min) -}}
{{- end -}}
{{- $max := .max | toString -}}
{{- if eq $max "" }}{{ $max = include "outbox-relay.laneCeiling" .ctx }}{{ end -}}
{{- if not (regexMatch "^[0-9]+$" $max) -}}
{{- fail (printf "%s: %q is not a whole number of relays" .maxName $max) -}}
{{- end -}}
{{- if lt (atoi $max) (atoi $min) -}}
{{- fail (printf "%s: %s is below %s (%s)" .maxName $max .minName $min) -}}
{{- end -}}
{{- if gt (atoi $max) 256 -}}
{{- fail (printf "%s: %s: a route has 256 lanes, and a relay beyond 256 holds none; with these workers relays add workers up to %s (leave %s empty for that)" .maxName $max (include "outbox-relay.laneCeiling" .ctx) .maxName) -}}
{{- end -}}
{{- printf "%s %s" $min $max -}}
{{- end -}}

{{/*
The PromQL of the backlog autoscaling follows: the messages ready to be
delivered now (pending minus those waiting for a retry or a delivery time;
every relay exports the whole outbox's counts, from one query, so each
pod's difference is taken and then the largest), or 0 while a route's
destination is down (more relays would only probe it more), selected by
the labels the Prometheus Operator gives the chart's ServiceMonitor.
*/}}
{{- define "outbox-relay.backlogQuery" -}}
{{- $sel := printf "namespace=%q,service=%q" .Release.Namespace (include "outbox-relay.fullname" .) -}}
{{- printf "(max(outbox_relay_pending_messages{%s} - outbox_relay_retrying_messages{%s} - outbox_relay_delayed_messages{%s}) unless on() (max(outbox_relay_destination_down{%s}) > 0)) or on() vector(0)" $sel $sel $sel $sel -}}
{{- end -}}

{{/*
Fails when both autoscalers are enabled. Every template that depends on
the choice includes it first, so this error comes before any other.
*/}}
{{- define "outbox-relay.oneAutoscaler" -}}
{{- if and .Values.keda.enabled .Values.hpa.enabled -}}
{{- fail "keda.enabled and hpa.enabled: enable one autoscaler (KEDA runs its own HorizontalPodAutoscaler for the ScaledObject, and two would fight over the relays' replicas)" -}}
{{- end -}}
{{- end -}}

{{/*
The Secrets holding the database URLs of the config file's sources list
(config.sources), as a JSON list of {name, existingSecret, secretKey}:
database.sourceSecrets, and in the migration Job (migration true) each
replaced by the migration.database.sourceSecrets entry of the same name.
Each is mounted at /var/run/secrets/outbox-relay/sources/<name>, the
directory of the file a source's database-url-file names. Fails on an
entry without a name of the list or a Secret, and on entries without a
list. Called with (dict "ctx" $ "migration" true|false).
*/}}
{{- define "outbox-relay.sourceSecrets" -}}
{{- $v := .ctx.Values -}}
{{- $names := list -}}
{{- range (dig "sources" (list) $v.config) -}}
{{- if kindIs "map" . }}{{ $names = append $names (dig "name" "" . | toString) }}{{ end -}}
{{- end -}}
{{- $lists := list (list "database.sourceSecrets" ($v.database.sourceSecrets | default list)) -}}
{{- if .migration -}}
{{- $lists = append $lists (list "migration.database.sourceSecrets" (dig "sourceSecrets" (list) $v.migration.database)) -}}
{{- end -}}
{{- $byName := dict -}}
{{- $order := list -}}
{{- range $lists -}}
{{- $value := index . 0 -}}
{{- $seen := dict -}}
{{- range $i, $s := index . 1 -}}
{{- $field := printf "%s[%d]" $value $i -}}
{{- if not $names -}}
{{- fail (printf "%s: mounts the database URL of a source, and config.sources lists none (docs/operations.md#many-databases)" $field) -}}
{{- end -}}
{{- $name := dig "name" "" $s | toString -}}
{{- if not (has $name $names) -}}
{{- fail (printf "%s.name: %q is not a source of config.sources (%s)" $field $name (join ", " $names)) -}}
{{- end -}}
{{- if not (dig "existingSecret" "" $s) -}}
{{- fail (printf "%s.existingSecret: the Secret holding source %s's database URL" $field $name) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "%s.name: %q is given twice" $field $name) -}}
{{- end -}}
{{- $_ := set $seen $name true -}}
{{- if not (hasKey $byName $name) }}{{ $order = append $order $name }}{{ end -}}
{{- $_ := set $byName $name (dict "name" $name "existingSecret" $s.existingSecret "secretKey" (dig "secretKey" "database-url" $s)) -}}
{{- end -}}
{{- end -}}
{{- $out := list -}}
{{- range $order }}{{ $out = append $out (get $byName .) }}{{ end -}}
{{- toJson $out -}}
{{- end -}}


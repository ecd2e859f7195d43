{{/*
Helpers of the enim chart: the image, each pool's names and enimd.toml,
the operator's operator.toml, and the checks of settings a user must give.
*/}}

{{/* The one image every container runs (agent, plugin, operator). */}}
{{- define "enim.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
TOML from a map, written here rather than with toToml: values parsed from
YAML hold every number as a float, which toToml writes as 1.0, and enimd's
integer keys refuse that. Keys sort; scalars and arrays of scalars first,
then tables, then arrays of tables. A null value is left out, so a pool
can unset a default.
Argument: (list MAP PREFIX), PREFIX "" at the top or "a.b." below.
*/}}
{{- define "enim.toml.table" -}}
{{- $table := index . 0 }}
{{- $prefix := index . 1 }}
{{- range $key, $value := $table }}
{{- if and (not (kindIs "invalid" $value)) (not (kindIs "map" $value)) (not (include "enim.toml.isTables" $value)) }}
{{ include "enim.toml.key" $key }} = {{ include "enim.toml.value" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- $path := printf "%s%s" $prefix (include "enim.toml.key" $key) }}
{{- if kindIs "map" $value }}
[{{ $path }}]
{{- include "enim.toml.table" (list $value (printf "%s." $path)) }}
{{- else if include "enim.toml.isTables" $value }}
{{- range $value }}
[[{{ $path }}]]
{{- include "enim.toml.table" (list . (printf "%s." $path)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* "yes" when the value is a non-empty list of maps: an array of tables. */}}
{{- define "enim.toml.isTables" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) }}{{ if kindIs "map" (first .) }}yes{{ end }}{{ end }}
{{- end }}

{{/* A key: bare where TOML allows it, else quoted ("enim.io/pool"). */}}
{{- define "enim.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/* A value: JSON's string escapes are TOML's; whole numbers as integers. */}}
{{- define "enim.toml.value" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "enim.toml.value" $e }}{{ end }}]
{{- else if kindIs "map" . }}{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ include "enim.toml.key" $k }} = {{ include "enim.toml.value" (get $ $k) }}{{ end }} }
{{- else }}{{ fail (printf "enim: %v (%s) has no TOML form" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/* A pool's DaemonSet: the first pool's is `enimd`, the others' enimd-NAME. */}}
{{- define "enim.pool.agent" -}}
{{- if .first }}enimd{{ else }}enimd-{{ .pool.name }}{{ end }}
{{- end }}

{{/* A pool's ConfigMap, named as its DaemonSet. */}}
{{- define "enim.pool.configMap" -}}
{{- if .first }}enimd-config{{ else }}enimd-config-{{ .pool.name }}{{ end }}
{{- end }}

{{/*
A pool's enimd.toml as a map: agent.config, the pool's config over it,
then what the chart's own values decide: the mode (and DRA with it), the
metrics address, the service CIDRs, [pod_metadata] from imds, and the
`cluster` provider when the operator runs and the pool names none.
Argument: dict "root" $ "pool" POOL. Output: the map as JSON.
*/}}
{{- define "enim.pool.config" -}}
{{- $root := .root }}
{{- $pool := .pool }}
{{- $config := mustMergeOverwrite (deepCopy $root.Values.agent.config) (deepCopy ($pool.config | default dict)) }}
{{- $_ := set $config "mode" (ternary "secondary" "primary" (eq $pool.mode "secondary")) }}
{{- if eq $pool.mode "primary-dra" }}
{{- $_ := set $config "dra" (mustMergeOverwrite (deepCopy ($config.dra | default dict)) (dict "enabled" true)) }}
{{- end }}
{{- /* What enimd refuses at start, seen after the merge. */}}
{{- $dra := and $config.dra $config.dra.enabled }}
{{- if and $dra (ne $pool.mode "primary-dra") }}
{{- fail (printf "enim: pool %s: [dra] enabled comes with the pool mode primary-dra (enimd refuses DRA in secondary mode)" $pool.name) }}
{{- end }}
{{- if and $dra $config.device_plugin $config.device_plugin.enabled }}
{{- fail (printf "enim: pool %s: [dra] and [device_plugin] both enabled: enimd refuses to start with both; a primary-dra pool hands ENIs out through DRA only" $pool.name) }}
{{- end }}
{{- $_ := set $config "metrics_address" (printf "%s:%d" $root.Values.metrics.address (int $root.Values.metrics.port)) }}
{{- $hostPath := deepCopy ($config.host_path | default dict) }}
{{- if kindIs "invalid" $root.Values.serviceCIDRs }}
{{- $_ := set $hostPath "service_cidrs_from_api" true }}
{{- else }}
{{- $_ := set $hostPath "service_cidrs" $root.Values.serviceCIDRs }}
{{- end }}
{{- $_ := set $config "host_path" $hostPath }}
{{- $imds := $root.Values.imds }}
{{- if or $imds.allowedNamespaces (not (kindIs "invalid" $imds.blocked)) }}
{{- $metadata := dict }}
{{- if $imds.allowedNamespaces }}{{ $_ := set $metadata "allowed_namespaces" $imds.allowedNamespaces }}{{ end }}
{{- if not (kindIs "invalid" $imds.blocked) }}{{ $_ := set $metadata "blocked" $imds.blocked }}{{ end }}
{{- range $blocked := ($imds.blocked | default list) }}
{{- if has $blocked $root.Values.serviceCIDRs }}
{{- fail (printf "enim: imds.blocked %s is also in serviceCIDRs: enimd refuses a prefix pods both reach through the host and are refused" $blocked) }}
{{- end }}
{{- end }}
{{- $_ := set $config "pod_metadata" $metadata }}
{{- end }}
{{- if not $config.provider }}
{{- if not $root.Values.operator.enabled }}
{{- fail (printf "enim: pool %s has no provider: with operator.enabled=false set pools[].config.provider (type aws, bce or static and its keys), or turn the operator on" $pool.name) }}
{{- end }}
{{- $_ := set $config "provider" (dict "type" "cluster") }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/*
Every setting a user must give, checked in one order by each template
that needs them, so that `helm template` names the first one missing.
*/}}
{{- define "enim.checks" -}}
{{- if .Values.operator.enabled }}
{{- include "enim.operator.check" . }}
{{- end }}
{{- include "enim.pools.check" . }}
{{- end }}

{{/*
The operator's settings a user must give, checked before anything is
written: enim-operator would start with none of them and fail, or worse,
with a placeholder.
*/}}
{{- define "enim.operator.check" -}}
{{- $config := .Values.operator.config }}
{{- $operator := $config.operator | default dict }}
{{- $cloud := $config.cloud | default dict }}
{{- if not $cloud.type }}
{{- fail "enim: operator.config.cloud.type is required with operator.enabled: aws, bce or static" }}
{{- end }}
{{- if not $operator.cluster }}
{{- fail "enim: operator.config.operator.cluster is required with operator.enabled: the cluster's name, which tags every ENI the operator makes" }}
{{- end }}
{{- if and (ne $cloud.type "static") (not $operator.subnets) }}
{{- fail (printf "enim: operator.config.operator.subnets is required with cloud %s: the subnets new ENIs are made in" $cloud.type) }}
{{- end }}
{{- if and (eq $cloud.type "aws") (not $cloud.region) }}
{{- fail "enim: operator.config.cloud.region is required with cloud aws" }}
{{- end }}
{{- end }}

{{/*
The pools' checks: names unique, and with several pools a nodeSelector
each, so that no node gets two agents.
*/}}
{{- define "enim.pools.check" -}}
{{- $names := list }}
{{- range .Values.pools }}
{{- if has .name $names }}
{{- fail (printf "enim: pools: the name %s is used twice" .name) }}
{{- end }}
{{- $names = append $names .name }}
{{- if and (gt (len $.Values.pools) 1) (not .nodeSelector) }}
{{- fail (printf "enim: pool %s has no nodeSelector: with several pools each needs one, or a node would run two agents" .name) }}
{{- end }}
{{- end }}
{{- end }}

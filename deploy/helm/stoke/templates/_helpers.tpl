{{/*
stoke.name is the chart's name, or nameOverride.
*/}}
{{- define "stoke.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
stoke.fullname names the release's objects: fullnameOverride, else the
release's name when it already holds the chart's, else RELEASE-stoke.
Trimmed to 52 characters so that suffixes (-flags, -admin, …) stay under 63.
*/}}
{{- define "stoke.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "stoke.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "stoke.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stoke
{{- end -}}

{{- define "stoke.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stoke.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "stoke.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stoke.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* stoke.engineNamespace is where the engine pods live. */}}
{{- define "stoke.engineNamespace" -}}
{{- default .Release.Namespace .Values.engine.namespace -}}
{{- end -}}

{{- define "stoke.gatewayImage" -}}
{{- printf "%s:%s" .Values.gateway.image.repository (default .Chart.AppVersion .Values.gateway.image.tag) -}}
{{- end -}}

{{- define "stoke.engineImage" -}}
{{- printf "%s:%s" .Values.engine.image.repository (default .Chart.AppVersion .Values.engine.image.tag) -}}
{{- end -}}

{{/* The Secrets (name and key) the gateway reads. */}}
{{- define "stoke.adminKeySecret" -}}
{{- default (printf "%s-admin" (include "stoke.fullname" .)) .Values.auth.adminKey.existingSecret -}}
{{- end -}}

{{- define "stoke.s3Secret" -}}
{{- default (printf "%s-s3" (include "stoke.fullname" .)) .Values.s3.credentials.existingSecret -}}
{{- end -}}

{{- define "stoke.hasS3Credentials" -}}
{{- if or .Values.s3.credentials.existingSecret .Values.s3.credentials.accessKeyId .Values.s3.credentials.secretAccessKey -}}true{{- end -}}
{{- end -}}

{{- define "stoke.stateSecret" -}}
{{- default (printf "%s-state" (include "stoke.fullname" .)) .Values.state.postgres.existingSecret -}}
{{- end -}}

{{- define "stoke.hasPostgres" -}}
{{- if or .Values.state.postgres.existingSecret .Values.state.postgres.url -}}true{{- end -}}
{{- end -}}

{{- define "stoke.limitsSecret" -}}
{{- default (printf "%s-limits" (include "stoke.fullname" .)) .Values.limits.redis.existingSecret -}}
{{- end -}}

{{- define "stoke.hasRedis" -}}
{{- if or .Values.limits.redis.existingSecret .Values.limits.redis.url -}}true{{- end -}}
{{- end -}}

{{/*
stoke.flagEnv is the environment variable that carries serve flag NAME:
STOKE_FLAG_ and the name upper-cased, dashes as underscores.
*/}}
{{- define "stoke.flagEnv" -}}
{{- printf "STOKE_FLAG_%s" (. | upper | replace "-" "_") -}}
{{- end -}}

{{/*
stoke.tolerations renders a list of tolerations in the Pod spec's shape as
the flag value key=value:Effect,… (key:Effect for operator Exists without
a value).
*/}}
{{- define "stoke.tolerations" -}}
{{- $out := list -}}
{{- range . -}}
{{- if not .key -}}
{{- fail "nodePools.*.tolerations: every toleration needs a key (a toleration of every taint cannot be passed to --kube-tolerations)" -}}
{{- end -}}
{{- if not .effect -}}
{{- fail (printf "nodePools.*.tolerations: toleration %q needs an effect (NoSchedule, PreferNoSchedule or NoExecute)" .key) -}}
{{- end -}}
{{- if .value -}}
{{- $out = append $out (printf "%s=%s:%s" .key .value .effect) -}}
{{- else -}}
{{- $out = append $out (printf "%s:%s" .key .effect) -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* stoke.selector renders a map as the flag value k=v,… (keys sorted). */}}
{{- define "stoke.selector" -}}
{{- $out := list -}}
{{- range $k, $v := . -}}
{{- $out = append $out (printf "%s=%s" $k (toString $v)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/*
stoke.flags is every flag of `stoke serve` the chart sets, as a YAML map
NAME: VALUE (NAME without the dashes). The flags ConfigMap holds them, one
key (stoke.flagEnv NAME) each, and the container's arguments refer to them
as --NAME=$(KEY). Secret values are not here: see stoke.secretFlags.
*/}}
{{- define "stoke.flags" -}}
{{- $v := .Values -}}
{{- $f := dict -}}
{{- $_ := set $f "runtime" "kubernetes" -}}
{{- $_ = set $f "listen" (printf "0.0.0.0:%d" (int $v.gateway.port)) -}}
{{- $_ = set $f "data" "/var/lib/stoke" -}}
{{- $_ = set $f "bucket" $v.bucket -}}
{{- if $v.s3.endpoint }}{{ $_ = set $f "endpoint" $v.s3.endpoint }}{{ end -}}
{{- if $v.s3.region }}{{ $_ = set $f "region" $v.s3.region }}{{ end -}}
{{- if $v.s3.pathStyle }}{{ $_ = set $f "path-style" "true" }}{{ end -}}
{{- $_ = set $f "auth" $v.auth.mode -}}
{{- $_ = set $f "admin-key-file" (printf "/etc/stoke/admin/%s" $v.auth.adminKey.key) -}}
{{- $_ = set $f "drain-timeout" $v.gateway.drainTimeout -}}
{{- $_ = set $f "engine-image" (include "stoke.engineImage" .) -}}
{{- if $v.engine.namespace }}{{ $_ = set $f "kube-namespace" $v.engine.namespace }}{{ end -}}
{{- $_ = set $f "kube-engine-cpu" (toString $v.engine.cpu) -}}
{{- $_ = set $f "kube-engine-memory" (toString $v.engine.memory) -}}
{{- $_ = set $f "kube-engine-gpus" (toString (int $v.engine.gpus)) -}}
{{- $_ = set $f "kube-cache-path" $v.engine.cachePath -}}
{{- $_ = set $f "kube-install" (include "stoke.fullname" .) -}}
{{- $_ = set $f "kube-image-pull-policy" (default "IfNotPresent" $v.engine.image.pullPolicy) -}}
{{- if include "stoke.hasS3Credentials" . }}{{ $_ = set $f "kube-s3-secret" (printf "%s:%s:%s" (include "stoke.s3Secret" .) $v.s3.credentials.accessKeyIdKey $v.s3.credentials.secretAccessKeyKey) }}{{ end -}}
{{- $_ = set $f "cache-max-size" (toString $v.engine.cacheMaxSize) -}}
{{- $_ = set $f "slots" (toString (int $v.engine.slots)) -}}
{{- $_ = set $f "spot-slots" (toString (int $v.engine.spotSlots)) -}}
{{- $_ = set $f "warm" (toString (int $v.engine.warm)) -}}
{{- $_ = set $f "kv-cache-memory" (toString $v.engine.kvCacheMemory) -}}
{{- $_ = set $f "max-num-seqs" (toString (int $v.engine.maxNumSeqs)) -}}
{{- $_ = set $f "threads" (toString (int $v.engine.threads)) -}}
{{- if $v.engine.simProfile }}{{ $_ = set $f "sim-profile" $v.engine.simProfile }}{{ end -}}
{{- with $v.nodePools.onDemand.nodeSelector }}{{ $_ = set $f "kube-node-selector" (include "stoke.selector" .) }}{{ end -}}
{{- with $v.nodePools.onDemand.tolerations }}{{ $_ = set $f "kube-tolerations" (include "stoke.tolerations" .) }}{{ end -}}
{{- with $v.nodePools.spot.nodeSelector }}{{ $_ = set $f "kube-spot-node-selector" (include "stoke.selector" .) }}{{ end -}}
{{- with $v.nodePools.spot.tolerations }}{{ $_ = set $f "kube-spot-tolerations" (include "stoke.tolerations" .) }}{{ end -}}
{{- $_ = set $f "kube-priority-class-interactive" $v.priorityClasses.interactive.name -}}
{{- $_ = set $f "kube-priority-class-batch" $v.priorityClasses.batch.name -}}
{{- if $v.routes }}{{ $_ = set $f "routes" "/etc/stoke/routes/routes.yaml" }}{{ end -}}
{{- if $v.leaderElection.enabled -}}
{{- $_ = set $f "leader-elect" "true" -}}
{{- $_ = set $f "leader-elect-resource-name" (default (printf "%s-gateway" (include "stoke.fullname" .)) $v.leaderElection.resourceName) -}}
{{- $_ = set $f "leader-elect-lease-duration" $v.leaderElection.leaseDuration -}}
{{- $_ = set $f "leader-elect-renew-deadline" $v.leaderElection.renewDeadline -}}
{{- $_ = set $f "leader-elect-retry-period" $v.leaderElection.retryPeriod -}}
{{- end -}}
{{- range $k, $val := $v.gateway.extraFlags -}}
{{- if hasKey $f $k -}}
{{- fail (printf "gateway.extraFlags.%s: the chart sets --%s itself (from %s); set it there" $k $k "values.yaml") -}}
{{- end -}}
{{- if or (eq $k "state") (eq $k "limits") -}}
{{- fail (printf "gateway.extraFlags.%s: --%s is secret; set it with %s" $k $k (ternary "state.postgres" "limits.redis" (eq $k "state"))) -}}
{{- end -}}
{{- $_ = set $f $k (toString $val) -}}
{{- end -}}
{{- toYaml $f -}}
{{- end -}}

{{/*
stoke.secretFlags is the serve flags whose values come from Secrets, as a
YAML map NAME: {secret: SECRET, key: KEY}.
*/}}
{{- define "stoke.secretFlags" -}}
{{- $f := dict -}}
{{- if include "stoke.hasPostgres" . -}}
{{- $_ := set $f "state" (dict "secret" (include "stoke.stateSecret" .) "key" .Values.state.postgres.key) -}}
{{- end -}}
{{- if include "stoke.hasRedis" . -}}
{{- $_ := set $f "limits" (dict "secret" (include "stoke.limitsSecret" .) "key" .Values.limits.redis.key) -}}
{{- end -}}
{{- toYaml $f -}}
{{- end -}}

{{/*
stoke.validate fails the render on values that cannot work, saying which
value to change.
*/}}
{{- define "stoke.validate" -}}
{{- $v := .Values -}}
{{- $replicas := int $v.gateway.replicas -}}
{{- if not $v.bucket -}}
{{- fail "bucket is required: the s3://bucket[/prefix] that models are pushed to and engine pods load from (--set bucket=s3://models)" -}}
{{- end -}}
{{- if not (hasPrefix "s3://" $v.bucket) -}}
{{- fail (printf "bucket %q: must be an s3://bucket[/prefix] URL (engine pods on other nodes read it; a file:// bucket cannot work in a cluster)" $v.bucket) -}}
{{- end -}}
{{- if lt $replicas 1 -}}
{{- fail (printf "gateway.replicas=%d: at least 1 (the gateway scales engines to zero, not itself)" $replicas) -}}
{{- end -}}
{{- if gt $replicas 1 -}}
{{- if not $v.leaderElection.enabled -}}
{{- fail (printf "gateway.replicas=%d needs leaderElection.enabled=true: without it every replica runs the scaler and they fight over the engine pods" $replicas) -}}
{{- end -}}
{{- if not (include "stoke.hasPostgres" .) -}}
{{- fail (printf "gateway.replicas=%d needs shared state: set state.postgres.url or state.postgres.existingSecret (or gateway.replicas=1 to keep SQLite under --data)" $replicas) -}}
{{- end -}}
{{- if not (include "stoke.hasRedis" .) -}}
{{- fail (printf "gateway.replicas=%d needs shared limit counters: set limits.redis.url or limits.redis.existingSecret (or gateway.replicas=1), else each replica enforces every limit on its own" $replicas) -}}
{{- end -}}
{{- if $v.gateway.persistence.enabled -}}
{{- fail (printf "gateway.persistence.enabled needs gateway.replicas=1 (got %d): replicas share state through state.postgres, not a volume" $replicas) -}}
{{- end -}}
{{- end -}}
{{- if and $v.state.postgres.url (not (hasPrefix "postgres://" $v.state.postgres.url)) (not (hasPrefix "postgresql://" $v.state.postgres.url)) -}}
{{- fail "state.postgres.url: must be a postgres:// (or postgresql://) URL" -}}
{{- end -}}
{{- if and $v.limits.redis.url (not (hasPrefix "redis://" $v.limits.redis.url)) (not (hasPrefix "rediss://" $v.limits.redis.url)) -}}
{{- fail "limits.redis.url: must be a redis:// (or rediss://) URL" -}}
{{- end -}}
{{- if and (not $v.s3.credentials.existingSecret) (or $v.s3.credentials.accessKeyId $v.s3.credentials.secretAccessKey) (not (and $v.s3.credentials.accessKeyId $v.s3.credentials.secretAccessKey)) -}}
{{- fail "s3.credentials: set both accessKeyId and secretAccessKey (or existingSecret)" -}}
{{- end -}}
{{- if gt (int $v.engine.spotSlots) (int $v.engine.slots) -}}
{{- fail (printf "engine.spotSlots=%d: at most engine.slots=%d" (int $v.engine.spotSlots) (int $v.engine.slots)) -}}
{{- end -}}
{{- if le (int64 $v.priorityClasses.interactive.value) (int64 $v.priorityClasses.batch.value) -}}
{{- fail (printf "priorityClasses: interactive.value (%d) must be above batch.value (%d), so that interactive engines preempt batch ones" (int64 $v.priorityClasses.interactive.value) (int64 $v.priorityClasses.batch.value)) -}}
{{- end -}}
{{- if eq $v.priorityClasses.interactive.name $v.priorityClasses.batch.name -}}
{{- fail "priorityClasses: interactive.name and batch.name must differ" -}}
{{- end -}}
{{- if not (has $v.auth.mode (list "auto" "keys" "none")) -}}
{{- fail (printf "auth.mode %q: one of auto, keys, none" $v.auth.mode) -}}
{{- end -}}
{{- end -}}

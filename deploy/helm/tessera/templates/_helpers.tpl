{{/* Names: <release>-<component>, at most 63 characters. */}}
{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tessera" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.name" -}}
{{- printf "%s-%s" (include "tessera.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "node") */}}
{{- define "tessera.selector" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of a component, as the API server names the identity. */}}
{{- define "tessera.user" -}}
{{- printf "system:serviceaccount:%s:%s" .root.Release.Namespace (include "tessera.name" .) -}}
{{- end -}}

{{/* Whether the webhook's certificates come from cert-manager. */}}
{{- define "tessera.certManager" -}}
{{- $src := .Values.webhook.certificates.source -}}
{{- if or (eq $src "cert-manager") (and (eq $src "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* Environment every node agent needs: its node's name from the downward API. */}}
{{- define "tessera.nodeEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
# Under the NVIDIA container toolkit's runtime class these inject libnvidia-ml.so.1 and the
# device nodes; elsewhere they mean nothing.
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- with .Values.node.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The webhook's CA and serving certificate when the chart makes them (no cert-manager).
Made once per render and kept in .Values.__tesseraWebhookCerts, so the Secrets and the
caBundle agree. On upgrade the CA comes from Secret <webhook>-ca, and the serving pair from
Secret <webhook>-tls unless it was signed by another CA, is due (renewBeforeDays) or rotate
is set. */}}
{{- define "tessera.ensureWebhookCerts" -}}
{{- if not (hasKey .Values "__tesseraWebhookCerts") -}}
{{- $name := include "tessera.name" (dict "root" . "component" "webhook") -}}
{{- $c := .Values.webhook.certificates -}}
{{- $ns := .Release.Namespace -}}
{{- $layout := "2006-01-02T15:04:05Z" -}}
{{- $caSecret := lookup "v1" "Secret" $ns (printf "%s-ca" $name) -}}
{{- $caData := (get ($caSecret | default dict) "data") | default dict -}}
{{- $ca := dict -}}
{{- if and (hasKey $caData "tls.crt") (hasKey $caData "tls.key") -}}
{{- $ca = buildCustomCert (index $caData "tls.crt") (index $caData "tls.key") -}}
{{- else -}}
{{- $ca = genCA (printf "%s-ca" $name) 3650 -}}
{{- end -}}
{{- $tls := lookup "v1" "Secret" $ns (printf "%s-tls" $name) -}}
{{- $tlsData := (get ($tls | default dict) "data") | default dict -}}
{{- $tlsMeta := (get ($tls | default dict) "metadata") | default dict -}}
{{- $notAfter := index ((get $tlsMeta "annotations") | default dict) "gpu.tessera.dev/not-after" | default "" -}}
{{- $reuse := false -}}
{{- if and (not $c.rotate) $notAfter (hasKey $tlsData "tls.crt") (eq (index $tlsData "ca.crt" | default "") ($ca.Cert | b64enc)) -}}
{{- $left := sub (toDate $layout $notAfter | unixEpoch | int64) (now | unixEpoch | int64) -}}
{{- if gt $left (mul $c.renewBeforeDays 86400 | int64) -}}
{{- $reuse = true -}}
{{- end -}}
{{- end -}}
{{- $certs := dict "caCert" $ca.Cert "caKey" $ca.Key -}}
{{- if $reuse -}}
{{- $_ := set $certs "cert" (index $tlsData "tls.crt" | b64dec) -}}
{{- $_ := set $certs "key" (index $tlsData "tls.key" | b64dec) -}}
{{- $_ := set $certs "notAfter" $notAfter -}}
{{- else -}}
{{- $svc := printf "%s.%s.svc" $name $ns -}}
{{- $leaf := genSignedCert $svc nil (list $svc (printf "%s.cluster.local" $svc)) (int $c.validityDays) $ca -}}
{{- $_ := set $certs "cert" $leaf.Cert -}}
{{- $_ := set $certs "key" $leaf.Key -}}
{{- $_ := set $certs "notAfter" (dateInZone $layout (dateModify (printf "+%dh" (mul $c.validityDays 24)) now) "UTC") -}}
{{- end -}}
{{- $_ := set .Values "__tesseraWebhookCerts" $certs -}}
{{- end -}}
{{- end -}}

{{- define "tessera.webhookCA" -}}
{{- include "tessera.ensureWebhookCerts" . -}}
{{- .Values.__tesseraWebhookCerts.caCert | b64enc -}}
{{- end -}}

{{/* Modes (values.mode): "true" when the release serves DRA mode, legacy mode. */}}
{{- define "tessera.dra" -}}
{{- if has .Values.mode (list "dra" "both") -}}true{{- end -}}
{{- end -}}
{{- define "tessera.legacy" -}}
{{- if has .Values.mode (list "legacy" "both") -}}true{{- end -}}
{{- end -}}

{{/* The values the chart refuses, each failing the render with one message:
DRA mode on a cluster older than 1.36 (no consumable capacity), and DRA node agents that could
land on nodes labelled gpu.tessera.dev/mode=legacy, where legacy mode's device plugin runs:
with legacy mode served, every term of node.affinity must keep gpu.tessera.dev/mode off
"legacy" (NotIn [legacy], or In without legacy), or node.nodeSelector must name a mode other
than legacy. */}}
{{- define "tessera.checkModes" -}}
{{- if and (include "tessera.dra" .) (semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "mode=%s: DRA mode needs Kubernetes 1.36 or newer (consumable capacity); this cluster is %s: set mode=legacy (docs/install.md, 'Legacy mode')" .Values.mode .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and (eq .Values.mode "both") (or .Values.driver.enabled .Values.monitor.enabled) -}}
{{- $label := "gpu.tessera.dev/mode" -}}
{{- $sel := index (.Values.node.nodeSelector | default dict) $label | default "" -}}
{{- if not (and $sel (ne $sel "legacy")) -}}
{{- $terms := list -}}
{{- with .Values.node.affinity -}}{{- with .nodeAffinity -}}{{- with .requiredDuringSchedulingIgnoredDuringExecution -}}
{{- $terms = .nodeSelectorTerms | default list -}}
{{- end -}}{{- end -}}{{- end -}}
{{- if not $terms -}}
{{- fail (printf "mode=both: node.affinity has no required nodeSelectorTerms, so the DRA node agent would also run on nodes labelled %s=legacy beside legacy mode's device plugin: keep the default node.affinity, add {key: %s, operator: NotIn, values: [legacy]} to each term, or set node.nodeSelector: {%s: dra}" $label $label $label) -}}
{{- end -}}
{{- range $i, $t := $terms -}}
{{- $kept := false -}}
{{- range ($t.matchExpressions | default list) -}}
{{- if and (eq .key $label) (or (and (eq .operator "NotIn") (has "legacy" .values)) (and (eq .operator "In") (not (has "legacy" .values)))) -}}
{{- $kept = true -}}
{{- end -}}
{{- end -}}
{{- if not $kept -}}
{{- fail (printf "mode=both: node.affinity nodeSelectorTerms[%d] does not exclude nodes labelled %s=legacy, so the DRA node agent could run beside legacy mode's device plugin on one node: add {key: %s, operator: NotIn, values: [legacy]} to it, or set node.nodeSelector: {%s: dra}" $i $label $label $label) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

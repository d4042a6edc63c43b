{{/* Names, labels and the rendered nodegate config. */}}

{{- define "nodegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodegate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{/* 50, not 63: suffixes such as -webhook-ca must still fit a label value. */}}

{{- define "nodegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nodegate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nodegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodegate
{{- end -}}

{{- define "nodegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nodegate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The username the API server gives nodegate's pods: the only one that may lift the hold taint. */}}
{{- define "nodegate.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodegate.serviceAccountName" .) -}}
{{- end -}}

{{- define "nodegate.caSecretName" -}}
{{- default (printf "%s-ca" (include "nodegate.fullname" .)) .Values.ca.secretName -}}
{{- end -}}

{{- define "nodegate.tlsSecretName" -}}
{{- printf "%s-tls" (include "nodegate.fullname" .) -}}
{{- end -}}

{{- define "nodegate.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The serving certificate's DNS names: the Service's in-cluster names plus tls.extraDnsNames. */}}
{{- define "nodegate.dnsNames" -}}
{{- $svc := include "nodegate.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) -}}
{{- concat $names .Values.tls.extraDnsNames | uniq | toJson -}}
{{- end -}}

{{/* Paths inside the container; the config points at them. */}}
{{- define "nodegate.stateDir" -}}/var/lib/nodegate{{- end -}}
{{- define "nodegate.configDir" -}}/etc/nodegate/config{{- end -}}
{{- define "nodegate.tlsDir" -}}/etc/nodegate/tls{{- end -}}
{{- define "nodegate.ekRootsDir" -}}/etc/nodegate/ek-roots{{- end -}}

{{/*
Chart-wide checks that the schema cannot express. The ConfigMap (always rendered) includes this,
so a bad combination fails the whole render with one message.
*/}}
{{- define "nodegate.validate" -}}
{{- $cfg := .Values.config | default dict -}}
{{- range $key := list "listen" "tls" "state_dir" "store" -}}
{{- if hasKey $cfg $key -}}
{{- fail (printf "config.%s is set by the chart; remove it (see values.yaml: store, containerPort, tls)" $key) -}}
{{- end -}}
{{- end -}}
{{- range $section, $keys := dict "kubernetes" (list "kubeconfig" "namespace" "events_namespace") "gate" (list "lease_namespace") "admission" (list "owner" "listen") -}}
{{- $sub := get $cfg $section -}}
{{- if and $sub (kindIs "map" $sub) -}}
{{- range $key := $keys -}}
{{- if hasKey $sub $key -}}
{{- fail (printf "config.%s.%s is set by the chart (the release namespace / service account); remove it" $section $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.store "sqlite") (gt (int .Values.replicaCount) 1) -}}
{{- fail "store: sqlite keeps state in one pod's state_dir, so it needs replicaCount: 1 (used sessions and TOFU bindings would not be shared); use store: kubernetes for more replicas" -}}
{{- end -}}
{{- if and .Values.persistence.enabled (ne .Values.store "sqlite") -}}
{{- fail "persistence is for store: sqlite only; the kubernetes store keeps its state in the cluster" -}}
{{- end -}}
{{- if and (not .Values.ca.create) (not .Values.ca.secretName) -}}
{{- fail "ca.create is false: set ca.secretName to the Secret that holds the CA and the session key" -}}
{{- end -}}
{{- if not $cfg.trust_domain -}}
{{- fail "config.trust_domain is required: your SPIFFE trust domain, e.g. --set config.trust_domain=fleet.example.com (the CA Secret is made for it on the first start and cannot change later)" -}}
{{- end -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled (not (or $np.apiServer.webhookSourceCidrs $np.apiServer.cidrs)) -}}
{{- fail "networkPolicy.apiServer.webhookSourceCidrs is required: the API server's source addresses, the only ones the webhook port admits (e.g. the control-plane nodes' subnet; ['0.0.0.0/0', '::/0'] admits any source on purpose), or set networkPolicy.enabled=false" -}}
{{- end -}}
{{- if and .Values.certManager.enabled .Values.certManager.issuerRef.name (not (has .Values.certManager.issuerRef.kind (list "Issuer" "ClusterIssuer"))) -}}
{{- fail "certManager.issuerRef.kind must be Issuer or ClusterIssuer" -}}
{{- end -}}
{{- end -}}

{{/* The nodegate config: the user's `config` with the keys the chart owns set on top. */}}
{{- define "nodegate.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $ns := .Release.Namespace -}}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.containerPort)) -}}
{{- $tlsDir := include "nodegate.tlsDir" . -}}
{{- $_ := set $cfg "tls" (dict "cert_file" (printf "%s/tls.crt" $tlsDir) "key_file" (printf "%s/tls.key" $tlsDir)) -}}
{{- $_ := set $cfg "state_dir" (include "nodegate.stateDir" .) -}}
{{- $_ := set $cfg "store" .Values.store -}}
{{- $kube := get $cfg "kubernetes" | default dict -}}
{{- $_ := set $kube "namespace" $ns -}}
{{- $_ := set $kube "events_namespace" $ns -}}
{{- $_ := set $cfg "kubernetes" $kube -}}
{{- $gate := get $cfg "gate" | default dict -}}
{{- $_ := set $gate "lease_namespace" $ns -}}
{{- $_ := set $cfg "gate" $gate -}}
{{- $adm := get $cfg "admission" | default dict -}}
{{- $_ := set $adm "owner" (include "nodegate.username" .) -}}
{{- $_ := set $adm "listen" (printf "0.0.0.0:%d" (int .Values.admissionContainerPort)) -}}
{{- /* The API server's sources, as the NetworkPolicy admits them: the webhooks' listener keeps
room for them (docs/admission.md, "Connections"); a value the user set wins. */ -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled (not (hasKey $adm "api_server_sources")) -}}
{{- $_ := set $adm "api_server_sources" ($np.apiServer.webhookSourceCidrs | default $np.apiServer.cidrs) -}}
{{- end -}}
{{- $_ := set $cfg "admission" $adm -}}
{{- if .Values.ekRoots.configMap -}}
{{- $roots := get $cfg "ek_roots" | default list -}}
{{- $_ := set $cfg "ek_roots" (append $roots (include "nodegate.ekRootsDir" .) | uniq) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The Helm-generated serving certificate (certManager.enabled=false), as JSON: crt, key, caCrt, caKey
(base64) and digest (of the names). Computed once per render and shared by the Secret, the webhook
caBundle and the Deployment's checksum, so all three see the same certificate. An upgrade finds the
installed Secret (lookup) and keeps it while the names are unchanged; new names get a new leaf
signed by the same CA, so the caBundle the API server and joining machines trust stays put.
*/}}
{{- define "nodegate.tlsMaterial" -}}
{{- if not (hasKey . "nodegateTLS") -}}
{{- $dnsNames := include "nodegate.dnsNames" . | fromJsonArray -}}
{{- $ips := .Values.tls.ipAddresses -}}
{{- $digest := printf "%s|%s" (join "," $dnsNames) (join "," $ips) | sha256sum -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "nodegate.tlsSecretName" .) | default dict -}}
{{- $data := get $existing "data" | default dict -}}
{{- $annotations := dig "metadata" "annotations" (dict) $existing -}}
{{- $out := dict "digest" $digest -}}
{{- if and (hasKey $data "tls.crt") (hasKey $data "tls.key") (hasKey $data "ca.crt") (eq (get $annotations "nodegate.io/names-sha256") $digest) -}}
{{- $_ := set $out "crt" (get $data "tls.crt") -}}
{{- $_ := set $out "key" (get $data "tls.key") -}}
{{- $_ := set $out "caCrt" (get $data "ca.crt") -}}
{{- $_ := set $out "caKey" (get $data "ca.key" | default "") -}}
{{- else -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $ca := dict -}}
{{- if and (hasKey $data "ca.crt") (hasKey $data "ca.key") -}}
{{- $ca = buildCustomCert (get $data "ca.crt") (get $data "ca.key") -}}
{{- else -}}
{{- $ca = genCA (printf "%s-webhook-ca" (include "nodegate.fullname" .)) $days -}}
{{- end -}}
{{- $cert := genSignedCert (first $dnsNames) $ips $dnsNames $days $ca -}}
{{- $_ := set $out "crt" ($cert.Cert | b64enc) -}}
{{- $_ := set $out "key" ($cert.Key | b64enc) -}}
{{- $_ := set $out "caCrt" ($ca.Cert | b64enc) -}}
{{- $_ := set $out "caKey" ($ca.Key | b64enc) -}}
{{- end -}}
{{- $_ := set . "nodegateTLS" $out -}}
{{- end -}}
{{- get . "nodegateTLS" | toJson -}}
{{- end -}}

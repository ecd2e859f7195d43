# Per-run certificates and service-account keys for the e2e cluster
# (scripts/cluster/node.sh sources it). Everything is made fresh in DIR with
# openssl: a CA, the API server's serving cert, and one client cert per
# component, its identity in CN (user) and O (group) as the Node authorizer
# and the default RBAC bindings expect.

# pki_make DIR NODE_NAME NODE_IP SERVICE_IP
pki_make() {
  local dir=$1 node=$2 ip=$3 svc=$4
  mkdir -p "$dir"
  (
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj "/CN=enim-e2e-ca" 2>/dev/null
    # The API server: reached at the node's address, the kubernetes
    # Service's ClusterIP and its DNS names.
    pki_cert apiserver "/CN=kube-apiserver" \
      "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:$ip,IP:$svc" server
    pki_cert admin "/O=system:masters/CN=enim-e2e-admin" "" client
    pki_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" client
    pki_cert kubelet "/O=system:nodes/CN=system:node:$node" "" client
    pki_cert controller-manager "/CN=system:kube-controller-manager" "" client
    pki_cert scheduler "/CN=system:kube-scheduler" "" client
    pki_cert kube-proxy "/CN=system:kube-proxy" "" client
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

# pki_cert NAME SUBJECT SANS server|client (in the CA's dir)
pki_cert() {
  local name=$1 subj=$2 sans=$3 usage=$4 ext
  ext=$(mktemp)
  if [ "$usage" = server ]; then
    printf 'extendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$sans" > "$ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' > "$ext"
  fi
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$name.crt" -days 2 -extfile "$ext" 2>/dev/null
  rm -f "$name.csr" "$ext"
}

# pki_kubeconfig DIR NAME SERVER: a kubeconfig for NAME's client cert.
pki_kubeconfig() {
  local dir=$1 name=$2 server=$3
  cat > "$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $server
    certificate-authority: $dir/ca.crt
users:
- name: $name
  user:
    client-certificate: $dir/$name.crt
    client-key: $dir/$name.key
contexts:
- name: e2e
  context: {cluster: e2e, user: $name}
current-context: e2e
EOF
}

#!/usr/bin/env sh
# Makes what TLS between a shadowbrain cluster's nodes and its NATS servers needs, with
# openssl: a certificate authority of your own (ca.pem, ca-key.pem) and one certificate for
# the NATS servers (server-cert.pem, server-key.pem), valid for 127.0.0.1, localhost and the
# names or addresses you list. The servers use it for their clients and for the routes
# between them; nodes trust ca.pem ([cluster] tls_ca). Keep ca-key.pem off the servers.
#
#   docs/cluster/make-certs.sh DIR [HOST_OR_IP ...]
#   docs/cluster/make-certs.sh /etc/nats/tls nats0.example nats1.example 10.0.0.7
set -eu
dir=${1:?usage: make-certs.sh DIR [HOST_OR_IP ...]}
shift
mkdir -p "$dir"
cd "$dir"
san="IP:127.0.0.1,DNS:localhost"
for host in "$@"; do
  case $host in
    *[!0-9.]*:*|*:*) san="$san,IP:$host" ;;   # IPv6
    *[!0-9.]*) san="$san,DNS:$host" ;;
    *) san="$san,IP:$host" ;;
  esac
done
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
key ca-key.pem
openssl req -x509 -new -key ca-key.pem -days 825 -subj "/CN=shadowbrain NATS CA" -out ca.pem
key server-key.pem
openssl req -new -key server-key.pem -subj "/CN=nats" -out server.csr
# serverAuth for clients and routes; clientAuth because a server presents the same
# certificate when it opens a route to another.
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
  -extfile server.ext -out server-cert.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 600 ca-key.pem server-key.pem
echo "made ca.pem, ca-key.pem, server-cert.pem, server-key.pem in $dir for $san"

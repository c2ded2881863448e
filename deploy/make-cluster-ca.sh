#!/bin/sh
# Creates a cluster CA and one certificate per host for Tandem's tls+tcp://
# links (docs/multi-host.md). Needs the openssl command (deploy/install-deps.sh).
#
#   deploy/make-cluster-ca.sh DIR NAME [NAME...]
#
# DIR/ca.crt and DIR/ca.key are created once and reused on later runs (so
# hosts can be added); for every NAME (a host name or an IP address)
# DIR/NAME.crt and DIR/NAME.key are written, valid for client and server use,
# with NAME as the common name and subjectAltName. Give every process
# --tls-ca DIR/ca.crt --tls-cert DIR/NAME.crt --tls-key DIR/NAME.key, and copy
# only those three files to each host: ca.key stays where it was made.
#
# Environment: TANDEM_CA_DAYS (default 365) validity of new certificates,
# TANDEM_CA_SUBJECT (default "/CN=tandem-cluster-ca") the CA's subject.
set -eu

usage() {
	echo "usage: $0 DIR NAME [NAME...]   (NAME: host name or IP of a host)" >&2
	exit 2
}
[ $# -ge 2 ] || usage
case "$1" in -h | --help) usage ;; esac
command -v openssl >/dev/null 2>&1 || {
	echo "$0: openssl not found (run deploy/install-deps.sh)" >&2
	exit 1
}

dir=$1
shift
days=${TANDEM_CA_DAYS:-365}
subject=${TANDEM_CA_SUBJECT:-/CN=tandem-cluster-ca}
mkdir -p "$dir"
umask 077

if [ ! -f "$dir/ca.crt" ] || [ ! -f "$dir/ca.key" ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$dir/ca.key" -out "$dir/ca.crt" -days "$days" -subj "$subject" \
		-addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
	echo "make-cluster-ca: created $dir/ca.crt (keep $dir/ca.key private)"
else
	echo "make-cluster-ca: reusing $dir/ca.crt"
fi

for name in "$@"; do
	case "$name" in
	*[!A-Za-z0-9.:_-]* | "")
		echo "$0: '$name' is not a host name or IP address" >&2
		exit 2
		;;
	esac
	# An IP address gets an IP entry (and a DNS one, for TLS stacks that only
	# compare names); a host name gets a DNS entry.
	if printf '%s' "$name" | grep -Eq '^[0-9.]+$|:'; then
		san="IP:$name,DNS:$name"
	else
		san="DNS:$name"
	fi
	ext=$(mktemp)
	csr=$(mktemp)
	printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyAgreement\nextendedKeyUsage=serverAuth,clientAuth\n' \
		"$san" >"$ext"
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$dir/$name.key" -out "$csr" -subj "/CN=$name" 2>/dev/null
	openssl x509 -req -in "$csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
		-out "$dir/$name.crt" -days "$days" -extfile "$ext" 2>/dev/null
	rm -f "$ext" "$csr"
	chmod 644 "$dir/$name.crt"
	echo "make-cluster-ca: $dir/$name.crt, $dir/$name.key ($san)"
done
chmod 644 "$dir/ca.crt"

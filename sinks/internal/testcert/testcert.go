// Package testcert makes throwaway certificates for the sinks' TLS tests.
// It is for tests only.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Pair is a self-signed certificate for 127.0.0.1, its own CA, valid for
// an hour either side of now.
type Pair struct {
	Cert     tls.Certificate // for a test server
	CertFile string          // the certificate as PEM (a CA file, or a client certificate)
	KeyFile  string          // its private key as PEM
}

// New writes a fresh Pair into a temporary directory of t.
func New(t testing.TB) Pair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "outbox-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	check(t, err)
	dir := t.TempDir()
	p := Pair{
		Cert:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		CertFile: filepath.Join(dir, "cert.pem"),
		KeyFile:  filepath.Join(dir, "key.pem"),
	}
	check(t, os.WriteFile(p.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	check(t, os.WriteFile(p.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return p
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
}

package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki is the set of certificates and keys of one cluster start, written to dir.
type pki struct {
	dir string
}

func (p pki) file(name string) string { return filepath.Join(p.dir, name) }

type identity struct {
	commonName   string
	organization []string
}

// clientIdentities are the client certificates written next to the CA; the names are the
// kubeconfig users. The admin is in system:masters (cluster-admin, like kubeadm's admin.conf).
var clientIdentities = map[string]identity{
	"admin":              {commonName: "kubernetes-admin", organization: []string{"system:masters"}},
	"controller-manager": {commonName: "system:kube-controller-manager"},
	"scheduler":          {commonName: "system:kube-scheduler"},
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePKI(dir string) (pki, error) {
	p := pki{dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	now := time.Now().Add(-time.Hour)
	caKey, err := newKey()
	if err != nil {
		return p, err
	}
	sn, err := serial()
	if err != nil {
		return p, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "testcluster-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		return p, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.file("ca.crt"), "CERTIFICATE", caDER, 0o644); err != nil {
		return p, err
	}
	if err := writeKey(p.file("ca.key"), caKey); err != nil {
		return p, err
	}

	issue := func(name string, template *x509.Certificate) error {
		key, err := newKey()
		if err != nil {
			return err
		}
		sn, err := serial()
		if err != nil {
			return err
		}
		template.SerialNumber = sn
		template.NotBefore = now
		template.NotAfter = now.Add(365 * 24 * time.Hour)
		template.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, template, ca, key.Public(), crypto.Signer(caKey))
		if err != nil {
			return err
		}
		if err := writePEM(p.file(name+".crt"), "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writeKey(p.file(name+".key"), key)
	}

	if err := issue("apiserver", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}); err != nil {
		return p, fmt.Errorf("apiserver certificate: %w", err)
	}
	// Serving certificate for the node agent's kubelet endpoint (kubectl logs through the apiserver).
	if err := issue("kubelet", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "devcluster-node-agent"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}); err != nil {
		return p, fmt.Errorf("kubelet certificate: %w", err)
	}
	for name, id := range clientIdentities {
		if err := issue(name, &x509.Certificate{
			Subject:     pkix.Name{CommonName: id.commonName, Organization: id.organization},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}); err != nil {
			return p, fmt.Errorf("%s certificate: %w", name, err)
		}
	}

	// Service-account token signing key pair.
	saKey, err := newKey()
	if err != nil {
		return p, err
	}
	if err := writeKey(p.file("sa.key"), saKey); err != nil {
		return p, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return p, err
	}
	if err := writePEM(p.file("sa.pub"), "PUBLIC KEY", pubDER, 0o644); err != nil {
		return p, err
	}
	return p, nil
}

// writeKubeconfig writes a kubeconfig for user (a key of clientIdentities) with the certificates
// embedded, so that the file is usable on its own.
func writeKubeconfig(path, server string, p pki, user string) error {
	caPEM, err := os.ReadFile(p.file("ca.crt"))
	if err != nil {
		return err
	}
	certPEM, err := os.ReadFile(p.file(user + ".crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(p.file(user + ".key"))
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testcluster"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["testcluster"] = &clientcmdapi.Context{Cluster: "testcluster", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "testcluster"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// Write then rename, so that a reader never sees half a file.
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

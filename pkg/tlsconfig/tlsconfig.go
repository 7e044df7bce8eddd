// Package tlsconfig builds the TLS configurations of rls: the gRPC server's
// (TLS or mutual TLS, with certificates reloaded from disk without a
// restart) and the Redis client's (private CA, client certificate).
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultInterval is how often a Reloader looks at its files at most.
const DefaultInterval = time.Second

// LoadPair reads a PEM certificate (chain) and its PEM private key.
func LoadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("%s: %w", certFile, err)
		}
	}
	return pair, nil
}

// LoadPool reads a PEM bundle of CA certificates. A file without any
// certificate is an error.
func LoadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate found", file)
	}
	return pool, nil
}

// Files names the PEM files a Reloader serves: a certificate (chain) and its
// key, and optionally a CA bundle that client certificates must chain to.
type Files struct {
	Cert, Key string
	ClientCA  string // empty: no client certificates asked for
	// ClientSAN, with ClientCA, admits only the client certificates that
	// name it: a DNS name (wildcards as in a server's check), an IP address,
	// or a URI (a SPIFFE id) equal to it.
	ClientSAN string
}

// stamp identifies one version of a file.
type stamp struct {
	mod  time.Time
	size int64
	err  bool // the file could not be stat'ed
}

// Reloader holds a certificate pair (and a client CA pool) read from files
// and reads them again when a file's modification time or size changes,
// looking at most once per Interval, from the handshakes themselves: new
// connections pick up rotated files, established ones keep theirs. A new
// version that does not load (a half-written file, a key that does not match
// the certificate) keeps the last good one and is logged once.
type Reloader struct {
	files    Files
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	checked   time.Time // last look at the files
	stamps    [3]stamp  // of the files last tried, good or not
	cert      *tls.Certificate
	pool      *x509.CertPool
	server    *tls.Config // per-connection server config for cert and pool
	lastError string
}

// NewReloader loads the files once; it fails when they do not load. log may
// be nil.
func NewReloader(files Files, log *slog.Logger) (*Reloader, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("tlsconfig: a certificate and a key file are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{files: files, log: log, interval: DefaultInterval, now: time.Now}
	r.stamps = r.stat()
	if err := r.load(); err != nil {
		return nil, err
	}
	r.checked = r.now()
	return r, nil
}

func (r *Reloader) paths() [3]string {
	return [3]string{r.files.Cert, r.files.Key, r.files.ClientCA}
}

// stat returns the current stamps of the files.
func (r *Reloader) stat() [3]stamp {
	var s [3]stamp
	for i, p := range r.paths() {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			s[i] = stamp{err: true}
			continue
		}
		s[i] = stamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return s
}

// load reads every file and, when all load, installs them. r.mu is held
// (or r is not shared yet).
func (r *Reloader) load() error {
	pair, err := LoadPair(r.files.Cert, r.files.Key)
	if err != nil {
		return err
	}
	var pool *x509.CertPool
	if r.files.ClientCA != "" {
		if pool, err = LoadPool(r.files.ClientCA); err != nil {
			return err
		}
	}
	r.cert, r.pool = &pair, pool
	r.server = r.baseConfig()
	r.server.Certificates = []tls.Certificate{pair}
	if pool != nil {
		r.server.ClientCAs = pool
		r.server.ClientAuth = tls.RequireAndVerifyClientCert
		if san := r.files.ClientSAN; san != "" {
			r.server.VerifyConnection = func(cs tls.ConnectionState) error { return verifySAN(cs, san) }
		}
	}
	return nil
}

// verifySAN checks that the verified client certificate names san.
func verifySAN(cs tls.ConnectionState, san string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if leaf.VerifyHostname(san) == nil {
		return nil
	}
	for _, u := range leaf.URIs {
		if u.String() == san {
			return nil
		}
	}
	return fmt.Errorf("client certificate %q does not name %q (DNS, IP or URI SAN)", leaf.Subject.CommonName, san)
}

// maybeReload looks at the files when Interval has passed since the last
// look and reloads them when they changed.
func (r *Reloader) maybeReload() {
	now := r.now()
	if now.Sub(r.checked) < r.interval {
		return
	}
	r.checked = now
	st := r.stat()
	if st == r.stamps {
		return
	}
	r.stamps = st
	if err := r.load(); err != nil {
		if msg := err.Error(); msg != r.lastError {
			r.lastError = msg
			r.log.Error("TLS files changed but do not load; keeping the last good certificate",
				"cert", r.files.Cert, "key", r.files.Key, "client_ca", r.files.ClientCA, "err", err)
		}
		return
	}
	r.lastError = ""
	r.log.Info("TLS files reloaded", "cert", r.files.Cert, "subject", r.cert.Leaf.Subject.String(),
		"serial", r.cert.Leaf.SerialNumber.String(), "not_after", r.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
}

// Certificate returns the certificate in force, reloading first if due.
func (r *Reloader) Certificate() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maybeReload()
	return r.cert
}

// GetCertificate is for tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.Certificate(), nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate: it presents
// the certificate in force whatever the server asks for.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.Certificate(), nil
}

// GetConfigForClient is for tls.Config.GetConfigForClient: it returns the
// server configuration with the certificate and client CA pool in force.
func (r *Reloader) GetConfigForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maybeReload()
	return r.server, nil
}

// baseConfig is the server configuration without certificates.
func (r *Reloader) baseConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
	}
}

// ServerConfig returns a server configuration (TLS 1.2 or later, ALPN h2)
// that serves the certificate in force and, when Files.ClientCA is set,
// requires a client certificate that chains to the client CA pool in force.
func (r *Reloader) ServerConfig() *tls.Config {
	c := r.baseConfig()
	c.GetCertificate = r.GetCertificate
	c.GetConfigForClient = r.GetConfigForClient
	if r.files.ClientCA != "" {
		// Also set here, for code that looks at the base configuration.
		c.ClientAuth = tls.RequireAndVerifyClientCert
		r.mu.Lock()
		c.ClientCAs = r.pool
		r.mu.Unlock()
	}
	return c
}

// ClientOptions describes a TLS client configuration.
type ClientOptions struct {
	// CA is a PEM bundle of the CAs to trust instead of the system roots;
	// empty keeps the system roots.
	CA string
	// Cert and Key are a client certificate and its key (both or neither);
	// they are reloaded like a Reloader's when the files change.
	Cert, Key string
	// InsecureSkipVerify turns off verification of the server's certificate
	// (testing only).
	InsecureSkipVerify bool
}

// Client builds a client configuration (TLS 1.2 or later). log may be nil.
func Client(o ClientOptions, log *slog.Logger) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify}
	if o.CA != "" {
		pool, err := LoadPool(o.CA)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if (o.Cert == "") != (o.Key == "") {
		return nil, errors.New("tlsconfig: a client certificate needs both a certificate and a key file")
	}
	if o.Cert != "" {
		r, err := NewReloader(Files{Cert: o.Cert, Key: o.Key}, log)
		if err != nil {
			return nil, err
		}
		c.GetClientCertificate = r.GetClientCertificate
	}
	return c, nil
}

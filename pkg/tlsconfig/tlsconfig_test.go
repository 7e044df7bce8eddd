package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/testkit"
	"github.com/rls-project/rls/pkg/tlsconfig/tlstest"
)

// env is a CA with a server pair and a client CA written to a directory.
type env struct {
	dir                    string
	ca, clientCA           *tlstest.CA
	certFile, keyFile, caF string
	server                 tlstest.Pair
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), ca: tlstest.NewCA(t, "server CA"), clientCA: tlstest.NewCA(t, "client CA")}
	e.server = e.ca.Server(t, "rls-1")
	e.certFile = tlstest.Write(t, e.dir, "tls.crt", e.server.CertPEM)
	e.keyFile = tlstest.Write(t, e.dir, "tls.key", e.server.KeyPEM)
	e.caF = tlstest.Write(t, e.dir, "client-ca.crt", e.clientCA.PEM)
	return e
}

// reloader builds a Reloader on a fake clock that logs to the returned buffer.
func (e *env) reloader(t *testing.T, withCA bool) (*Reloader, *testkit.Clock, *testkit.Buffer) {
	t.Helper()
	logs := &testkit.Buffer{}
	files := Files{Cert: e.certFile, Key: e.keyFile}
	if withCA {
		files.ClientCA = e.caF
	}
	r, err := NewReloader(files, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clk := testkit.NewClock(time.Now())
	r.mu.Lock()
	r.now = clk.Now
	r.checked = clk.Now()
	r.mu.Unlock()
	return r, clk, logs
}

// tcpPair returns both ends of a loopback TCP connection (buffered by the
// kernel, unlike net.Pipe, so a refused handshake does not block on writes).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return sc, cc
}

// handshake runs one TLS handshake over loopback TCP and returns the
// client's view of it and the first error of either side.
func handshake(t *testing.T, server, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	sc, cc := tcpPair(t)
	defer sc.Close()
	defer cc.Close()
	deadline := time.Now().Add(5 * time.Second)
	_ = sc.SetDeadline(deadline)
	_ = cc.SetDeadline(deadline)
	srv := tls.Server(sc, server)
	errc := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err == nil {
			// TLS 1.3 clients finish before the server has checked their
			// certificate: read once so a refusal reaches the client.
			_, err = srv.Read(make([]byte, 1))
		}
		errc <- err
		srv.Close()
	}()
	cli := tls.Client(cc, client)
	err := cli.Handshake()
	if err == nil {
		_, err = cli.Write([]byte{0})
	}
	st := cli.ConnectionState()
	if err != nil {
		cc.Close() // the server may still wait for a hello that never comes
	}
	serr := <-errc
	if err == nil {
		err = serr
	}
	return st, err
}

func (e *env) clientConfig(certs ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(e.ca.Cert)
	return &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: certs}
}

func pair(t *testing.T, p tlstest.Pair) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func serialOf(st tls.ConnectionState) *big.Int {
	if len(st.PeerCertificates) == 0 {
		return nil
	}
	return st.PeerCertificates[0].SerialNumber
}

func TestServerTLS(t *testing.T) {
	e := newEnv(t)
	r, _, _ := e.reloader(t, false)
	st, err := handshake(t, r.ServerConfig(), e.clientConfig())
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if serialOf(st).Cmp(e.server.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", serialOf(st), e.server.Cert.SerialNumber)
	}
	if st.NegotiatedProtocol != "" {
		t.Logf("ALPN %q", st.NegotiatedProtocol)
	}
	old := e.clientConfig()
	old.MaxVersion = tls.VersionTLS11
	if _, err := handshake(t, r.ServerConfig(), old); err == nil {
		t.Fatal("a TLS 1.1 client was accepted; the minimum is TLS 1.2")
	}
}

func TestServerMutualTLS(t *testing.T) {
	e := newEnv(t)
	r, _, _ := e.reloader(t, true)
	good := pair(t, e.clientCA.Client(t, "envoy"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(good)); err != nil {
		t.Fatalf("client with a certificate of the client CA: %v", err)
	}
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig()); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	stranger := pair(t, tlstest.NewCA(t, "other CA").Client(t, "mallory"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(stranger)); err == nil {
		t.Fatal("a client with a certificate of another CA was accepted")
	}
	// The server's own CA is not the client CA.
	wrongCA := pair(t, e.ca.Client(t, "server-CA-client"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(wrongCA)); err == nil {
		t.Fatal("a client with a certificate of the server CA (not the client CA) was accepted")
	}
}

func TestRotationPickedUp(t *testing.T) {
	e := newEnv(t)
	r, clk, logs := e.reloader(t, false)
	next := e.ca.Server(t, "rls-2")
	tlstest.WriteAtomic(t, e.dir, "tls.crt", next.CertPEM)
	tlstest.WriteAtomic(t, e.dir, "tls.key", next.KeyPEM)

	// Within the interval the files are not looked at.
	clk.Advance(DefaultInterval / 2)
	st, err := handshake(t, r.ServerConfig(), e.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if serialOf(st).Cmp(e.server.Cert.SerialNumber) != 0 {
		t.Fatal("files re-read before the interval passed")
	}
	clk.Advance(DefaultInterval)
	st, err = handshake(t, r.ServerConfig(), e.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if serialOf(st).Cmp(next.Cert.SerialNumber) != 0 || st.PeerCertificates[0].Subject.CommonName != "rls-2" {
		t.Fatalf("after rotation served %v (%s), want %v", serialOf(st), st.PeerCertificates[0].Subject.CommonName, next.Cert.SerialNumber)
	}
	if !strings.Contains(logs.String(), "TLS files reloaded") {
		t.Errorf("reload not logged: %s", logs)
	}
}

func TestBrokenFilesKeepLastGood(t *testing.T) {
	e := newEnv(t)
	r, clk, logs := e.reloader(t, true)
	serial := func() *big.Int {
		t.Helper()
		return r.Certificate().Leaf.SerialNumber
	}
	// A half-written certificate.
	tlstest.Write(t, e.dir, "tls.crt", e.server.CertPEM[:len(e.server.CertPEM)/2])
	clk.Advance(DefaultInterval)
	if serial().Cmp(e.server.Cert.SerialNumber) != 0 {
		t.Fatal("a broken certificate replaced the good one")
	}
	for range 3 {
		clk.Advance(DefaultInterval)
		serial()
	}
	if n := strings.Count(logs.String(), "do not load"); n != 1 {
		t.Fatalf("broken files logged %d times, want once:\n%s", n, logs)
	}
	// A whole new certificate whose key is not written yet.
	next := e.ca.Server(t, "rls-2")
	tlstest.Write(t, e.dir, "tls.crt", next.CertPEM)
	clk.Advance(DefaultInterval)
	if serial().Cmp(e.server.Cert.SerialNumber) != 0 {
		t.Fatal("a certificate without its key replaced the good one")
	}
	// The client CA file broken meanwhile keeps the old pool too.
	tlstest.Write(t, e.dir, "client-ca.crt", []byte("not PEM"))
	tlstest.Write(t, e.dir, "tls.key", next.KeyPEM)
	clk.Advance(DefaultInterval)
	if serial().Cmp(e.server.Cert.SerialNumber) != 0 {
		t.Fatal("a broken client CA file let a new pair in")
	}
	good := pair(t, e.clientCA.Client(t, "envoy"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(good)); err != nil {
		t.Fatalf("last good config no longer accepts its clients: %v", err)
	}
	// Everything whole again: the new pair is served.
	tlstest.Write(t, e.dir, "client-ca.crt", e.clientCA.PEM)
	clk.Advance(DefaultInterval)
	if serial().Cmp(next.Cert.SerialNumber) != 0 {
		t.Fatal("the repaired files were not picked up")
	}
	// A missing file (mid-rotation) keeps the last good one too.
	if err := removeFile(e.keyFile); err != nil {
		t.Fatal(err)
	}
	clk.Advance(DefaultInterval)
	if serial().Cmp(next.Cert.SerialNumber) != 0 {
		t.Fatal("a missing key file dropped the certificate")
	}
}

func TestClientCARotation(t *testing.T) {
	e := newEnv(t)
	r, clk, _ := e.reloader(t, true)
	oldClient := pair(t, e.clientCA.Client(t, "envoy-old"))
	newCA := tlstest.NewCA(t, "client CA 2")
	newClient := pair(t, newCA.Client(t, "envoy-new"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(newClient)); err == nil {
		t.Fatal("client of the future CA accepted before rotation")
	}
	tlstest.WriteAtomic(t, e.dir, "client-ca.crt", newCA.PEM)
	clk.Advance(DefaultInterval)
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(newClient)); err != nil {
		t.Fatalf("client of the new CA refused after rotation: %v", err)
	}
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(oldClient)); err == nil {
		t.Fatal("client of the removed CA still accepted after rotation")
	}
}

func TestNewReloaderErrors(t *testing.T) {
	e := newEnv(t)
	other := e.ca.Server(t, "other")
	otherKey := tlstest.Write(t, e.dir, "other.key", other.KeyPEM)
	empty := tlstest.Write(t, e.dir, "empty.pem", nil)
	for name, f := range map[string]Files{
		"missing cert":  {Cert: e.dir + "/nope.crt", Key: e.keyFile},
		"missing key":   {Cert: e.certFile, Key: e.dir + "/nope.key"},
		"mismatch":      {Cert: e.certFile, Key: otherKey},
		"empty CA":      {Cert: e.certFile, Key: e.keyFile, ClientCA: empty},
		"missing CA":    {Cert: e.certFile, Key: e.keyFile, ClientCA: e.dir + "/nope.crt"},
		"no cert given": {Key: e.keyFile},
	} {
		if _, err := NewReloader(f, nil); err == nil {
			t.Errorf("%s: NewReloader succeeded", name)
		}
	}
}

func TestClient(t *testing.T) {
	e := newEnv(t)
	r, _, _ := e.reloader(t, true)
	cp := e.clientCA.Client(t, "rls")
	dir := t.TempDir()
	ca := tlstest.Write(t, dir, "ca.crt", e.ca.PEM)
	cert := tlstest.Write(t, dir, "c.crt", cp.CertPEM)
	key := tlstest.Write(t, dir, "c.key", cp.KeyPEM)

	c, err := Client(ClientOptions{CA: ca, Cert: cert, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	if _, err := handshake(t, r.ServerConfig(), c); err != nil {
		t.Fatalf("client with CA and certificate: %v", err)
	}
	c, err = Client(ClientOptions{CA: ca}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	if _, err := handshake(t, r.ServerConfig(), c); err == nil {
		t.Fatal("client without a certificate accepted by an mTLS server")
	}
	// Without --redis-tls-ca the system roots do not know the test CA.
	c, err = Client(ClientOptions{Cert: cert, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	if _, err := handshake(t, r.ServerConfig(), c); err == nil {
		t.Fatal("server certificate of an unknown CA accepted")
	}
	c, err = Client(ClientOptions{Cert: cert, Key: key, InsecureSkipVerify: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, r.ServerConfig(), c); err != nil {
		t.Fatalf("InsecureSkipVerify: %v", err)
	}
	if _, err := Client(ClientOptions{Cert: cert}, nil); err == nil {
		t.Error("a certificate without a key accepted")
	}
	if _, err := Client(ClientOptions{CA: key}, nil); err == nil {
		t.Error("a CA file without certificates accepted")
	}
}

func removeFile(p string) error { return os.Remove(p) }

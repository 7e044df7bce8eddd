package connguard

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/credentials"

	"github.com/rls-project/rls/pkg/testkit"
)

// serverFrames is what a gRPC server could write, by x/net/http2's Framer:
// SETTINGS, refused streams among HEADERS, big DATA frames whose payloads
// look like refused streams' RST_STREAM frames, RST_STREAM with other
// codes, a PING, a WINDOW_UPDATE. It returns the bytes and how many
// streams they refuse.
func serverFrames(t testing.TB) ([]byte, int) {
	t.Helper()
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fake := bytes.Repeat([]byte{0, 0, 4, 3, 0, 0, 0, 0, 1, 0, 0, 0, 7}, 1300) // RST_STREAM REFUSED_STREAM frames, as payload
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 256}))
	must(fr.WriteRSTStream(1, http2.ErrCodeRefusedStream))
	must(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x88}, EndHeaders: true}))
	must(fr.WriteData(3, false, fake[:16384]))
	must(fr.WriteData(3, true, nil))
	must(fr.WriteRSTStream(5, http2.ErrCodeCancel))
	must(fr.WriteRSTStream(7, http2.ErrCodeProtocol))
	must(fr.WritePing(false, [8]byte{0, 0, 4, 3, 0, 0, 0, 0}))
	must(fr.WriteRSTStream(9, http2.ErrCodeRefusedStream))
	must(fr.WriteData(11, false, fake[1:16001]))
	must(fr.WriteRSTStream(13, http2.ErrCodeRefusedStream))
	must(fr.WriteWindowUpdate(0, 1<<20))
	return b.Bytes(), 3
}

// TestFrameScanner: refused streams are counted whatever the writes'
// boundaries: whole, several frames per write, every frame split at every
// byte, payloads (big DATA frames) skipped, other frames ignored.
func TestFrameScanner(t *testing.T) {
	b, want := serverFrames(t)
	var whole frameScanner
	if got := whole.scan(b); got != want {
		t.Fatalf("one write: %d refused, want %d", got, want)
	}
	for _, size := range []int{1, 2, 3, 4, 5, 8, 9, 10, 12, 13, 14, 100, 4096, 16393} {
		var f frameScanner
		got := 0
		for p := b; len(p) > 0; {
			n := min(size, len(p))
			got += f.scan(p[:n])
			p = p[n:]
		}
		if got != want || f.nhdr != 0 {
			t.Errorf("writes of %d bytes: %d refused, want %d (mid-frame at the end: %v)", size, got, want, f.nhdr != 0)
		}
	}
	// A frame split at each byte between two writes.
	rst := b[len(b)-13-13 : len(b)-13] // the last RST_STREAM
	for i := 0; i <= len(rst); i++ {
		var f frameScanner
		if got := f.scan(rst[:i]) + f.scan(rst[i:]); got != 1 {
			t.Errorf("RST_STREAM split at %d: %d refused, want 1", i, got)
		}
	}
	var empty frameScanner
	if empty.scan(nil) != 0 || empty.scan([]byte{}) != 0 {
		t.Error("an empty write counted")
	}
}

// BenchmarkFrameScanner measures the scan of one write: a call's answer
// (HEADERS, DATA, trailers: what most writes carry), and a 32 KiB write
// (grpc-go's write buffer) of nothing but RST_STREAM frames (a flood's).
func BenchmarkFrameScanner(b *testing.B) {
	var answer bytes.Buffer
	fr := http2.NewFramer(&answer, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: make([]byte, 40), EndHeaders: true})
	fr.WriteData(1, false, make([]byte, 30))
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: make([]byte, 20), EndHeaders: true, EndStream: true})
	for _, c := range []struct {
		name string
		buf  []byte
	}{{"answer", answer.Bytes()}, {"refusals32KiB", rstFrames(b, 32<<10/13)}} {
		b.Run(c.name, func(b *testing.B) {
			var f frameScanner
			b.SetBytes(int64(len(c.buf)))
			b.ReportAllocs()
			for b.Loop() {
				f.scan(c.buf)
			}
		})
	}
}

// rstFrames returns n RST_STREAM REFUSED_STREAM frames.
func rstFrames(t testing.TB, n int) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	for i := range n {
		if err := fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeRefusedStream); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// guardedPipe returns the server side of a pipe as the guard hands it to
// grpc-go, and its peer, whose writes are drained unless drain is false.
func guardedPipe(t *testing.T, g *RefusedStreams, drain bool) (net.Conn, net.Conn) {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { client.Close() })
	if drain {
		go io.Copy(io.Discard, client)
	}
	conn, _, err := g.Creds(nil).ServerHandshake(server)
	if err != nil {
		t.Fatal(err)
	}
	return conn, client
}

// TestRefusedStreamsHolds: the write that makes a connection's refused
// streams in a second exceed the limit holds it (counted once, logged):
// its writes go on, its reads wait, and it is closed the hold later, read
// or not. Up to the limit, and below it in each second, it is neither held
// nor closed.
func TestRefusedStreamsHolds(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	var logs testkit.Buffer
	clk := testkit.NewClock(time.Unix(1000, 0))
	g := NewRefusedStreams(RefusedOptions{Limit: 10, Port: "grpc-addr", Metrics: m,
		Log: slog.New(slog.NewTextHandler(&logs, nil)), Now: clk.Now})
	closed := func() float64 { return testutil.ToFloat64(m.closed.WithLabelValues("grpc-addr", "refused_streams")) }

	conn, client := guardedPipe(t, g, true)
	if _, err := conn.Write(rstFrames(t, 10)); err != nil {
		t.Fatalf("10 refused (the limit): %v", err)
	}
	if conn.(*watchConn).held.Load() {
		t.Fatal("held at the limit")
	}
	if _, err := conn.Write(rstFrames(t, 1)); err != nil {
		t.Fatalf("the 11th refused stream: %v, want the write to go on", err)
	}
	if _, err := conn.Write(rstFrames(t, 100)); err != nil {
		t.Fatalf("a held connection's write: %v", err)
	}
	start := time.Now()
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, ErrRefusedStreams) {
		t.Fatalf("a held connection's read: %v, want ErrRefusedStreams", err)
	}
	if held := time.Since(start); held < DefaultHold-50*time.Millisecond || held > DefaultHold+time.Second {
		t.Errorf("held %v, want %v", held, DefaultHold)
	}
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the peer's read after the hold: %v, want EOF", err)
	}
	if closed() != 1 {
		t.Errorf("closed = %v, want 1", closed())
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "peer=pipe") {
		t.Errorf("no warning with the peer: %q", logs.String())
	}

	// Closed while held (grpc-go stopping), with a hold that would outlast
	// the test: the read returns at once, whether it began before the
	// close or after.
	long := NewRefusedStreams(RefusedOptions{Limit: 10, Port: "grpc-addr", Metrics: m, Hold: time.Hour})
	conn3, _ := guardedPipe(t, long, true)
	conn3.Write(rstFrames(t, 11))
	read := make(chan error, 1)
	go func() {
		_, err := conn3.Read(make([]byte, 1))
		read <- err
	}()
	conn3.Close()
	select {
	case err := <-read:
		if err == nil {
			t.Error("a held connection closed: its read returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a held connection closed: its read still waits 10 s later")
	}

	// Held, and never read again (its peer sends nothing): closed all the
	// same.
	conn4, client4 := guardedPipe(t, g, false)
	go conn4.Write(rstFrames(t, 11))
	start = time.Now()
	client4.SetReadDeadline(start.Add(DefaultHold + 2*time.Second))
	if _, err := io.Copy(io.Discard, client4); err != nil || time.Since(start) < DefaultHold-50*time.Millisecond {
		t.Errorf("a held connection never read: closed after %v (%v), want %v", time.Since(start), err, DefaultHold)
	}

	// A connection refused 8 streams a second: never held.
	conn2, _ := guardedPipe(t, g, true)
	for range 3 {
		if _, err := conn2.Write(rstFrames(t, 8)); err != nil {
			t.Fatalf("8 refused a second: %v", err)
		}
		clk.Advance(1100 * time.Millisecond) // the second is over
	}
	if conn2.(*watchConn).held.Load() || closed() != 3 {
		t.Errorf("held %v, closed = %v; want not held, 3 closed", conn2.(*watchConn).held.Load(), closed())
	}
	conn2.Close()
}

// TestRefusedStreamsTLS: with TLS the guard sees the frames inside the TLS
// records (the connection the inner credentials' handshake returns).
func TestRefusedStreamsTLS(t *testing.T) {
	g := NewRefusedStreams(RefusedOptions{Limit: 10, Port: "grpc-addr", Metrics: NewMetrics(prometheus.NewRegistry())})
	inner := &fakeCreds{}
	c := g.Creds(inner)
	server, client := net.Pipe()
	defer client.Close()
	conn, info, err := c.ServerHandshake(server)
	if err != nil || info != fakeInfo {
		t.Fatalf("handshake: %v %v", info, err)
	}
	wc, ok := conn.(*watchConn)
	if !ok || wc.Conn != inner.conn {
		t.Fatalf("the watched connection is not the inner handshake's: %T", conn)
	}
	if c.Info().SecurityProtocol != "fake" || c.Clone().Info().SecurityProtocol != "fake" {
		t.Error("Info or Clone lost the inner credentials")
	}
	if g.Creds(nil).Info().SecurityProtocol != "" {
		t.Error("plaintext credentials claim a security protocol")
	}
}

func TestRefusedLimit(t *testing.T) {
	for maxStreams, want := range map[int]int{1: 100, 50: 100, 256: 512} {
		if got := RefusedLimit(maxStreams); got != want {
			t.Errorf("RefusedLimit(%d) = %d, want %d", maxStreams, got, want)
		}
	}
}

// fakeCreds stand for TLS: their handshake returns another connection.
type fakeCreds struct{ conn net.Conn }

type fakeAuth struct{}

func (fakeAuth) AuthType() string { return "fake" }

var fakeInfo credentials.AuthInfo = fakeAuth{}

func (f *fakeCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	f.conn = &struct{ net.Conn }{raw}
	return f.conn, fakeInfo, nil
}

func (f *fakeCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server only")
}

func (f *fakeCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "fake"}
}
func (f *fakeCreds) Clone() credentials.TransportCredentials { return &fakeCreds{} }
func (f *fakeCreds) OverrideServerName(string) error         { return nil }

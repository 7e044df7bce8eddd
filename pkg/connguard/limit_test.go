package connguard

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestLimit: beyond the cap, with a call in flight on every connection, a
// connection is accepted and closed at once (counted, and logged once
// however many); closing one of those held frees its slot, once however
// often it is closed.
func TestLimit(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	var logs testkit.Buffer
	l := Limit(raw, LimitOptions{Port: "grpc-addr", Max: 2, Metrics: m, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closedWithin reports whether the server closed c (a read sees EOF)
	// within d.
	closedWithin := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	dial()
	dial()
	held := []net.Conn{<-accepted, <-accepted}
	for _, c := range held {
		l.ConnState(c, http.StateActive) // busy: nothing to evict
	}
	for range 3 {
		if c := dial(); !closedWithin(c, 10*time.Second) {
			t.Fatal("a connection beyond the cap was not closed")
		}
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("grpc-addr")); got != 3 {
		t.Errorf("refused = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
	if n := strings.Count(logs.String(), "connection limit reached"); n != 1 {
		t.Errorf("%d warnings for 3 refused connections, want 1:\n%s", n, logs.String())
	}
	held[0].Close()
	held[0].Close() // twice frees once
	if fourth := dial(); closedWithin(fourth, 300*time.Millisecond) {
		t.Fatal("a connection within the cap (after one closed) was closed")
	}
	<-accepted
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
}

// TestLimitNoCap: Max 0 caps nothing and still counts.
func TestLimitNoCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	l := Limit(raw, LimitOptions{Port: "http-addr", Metrics: m})
	defer l.Close()
	for range 5 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := l.Accept(); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("http-addr")); got != 5 {
		t.Errorf("open = %v, want 5", got)
	}
}

// limitServer is a Listener on loopback whose accepted connections are
// sent on the returned channel.
func limitServer(t *testing.T, o LimitOptions) (*Listener, <-chan net.Conn, func() net.Conn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(raw, o)
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return l, accepted, dial
}

// TestLimitEvictsIdlest: at the cap a new connection is accepted by
// closing an idle one: first one that never made a call, then the one
// whose last call ended the longest ago; one with a call in flight never.
func TestLimitEvictsIdlest(t *testing.T) {
	clk := testkit.NewClock(time.Unix(1000, 0))
	m := NewMetrics(prometheus.NewRegistry())
	l, accepted, dial := limitServer(t, LimitOptions{Port: "grpc-addr", Max: 3, Metrics: m, Now: clk.Now, FirstCall: time.Hour})
	var client, server []net.Conn
	for range 3 {
		client = append(client, dial())
		server = append(server, <-accepted)
		clk.Advance(time.Second)
	}
	// 0: busy; 1: made a call that ended at 1003 s; 2: made one that ended at 1004 s.
	l.ConnState(server[0], http.StateActive)
	for i, c := range server[1:] {
		l.ConnState(c, http.StateActive)
		clk.Advance(time.Duration(i+1) * time.Second)
		l.ConnState(c, http.StateIdle)
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	fresh := dial() // never calls: evicted first next time
	<-accepted
	if !closed(client[1]) {
		t.Fatal("the connection idle the longest was not evicted")
	}
	dial()
	<-accepted
	if !closed(fresh) {
		t.Fatal("the connection that never made a call was not evicted before one that did")
	}
	if got := testutil.ToFloat64(m.closed.WithLabelValues("grpc-addr", ReasonIdleEvicted)); got != 2 {
		t.Errorf("evicted = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 3 {
		t.Errorf("open = %v, want 3", got)
	}
	client[0].SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := client[0].Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		t.Error("the connection with a call in flight was closed")
	}
}

// TestLimitClosesConnectionsWithoutCall: a connection that makes no call
// within FirstCall is closed (counted); one that made a call is not.
func TestLimitClosesConnectionsWithoutCall(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	l, accepted, dial := limitServer(t, LimitOptions{Port: "http-addr", Max: 10, Metrics: m, FirstCall: 50 * time.Millisecond})
	silent := dial()
	<-accepted
	caller := dial()
	l.ConnState(<-accepted, http.StateActive)
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("a connection without a call is still open: %v", err)
	}
	testkit.WaitFor(t, "no_call counted", 5*time.Second, func() bool {
		return testutil.ToFloat64(m.closed.WithLabelValues("http-addr", ReasonNoCall)) == 1
	})
	caller.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := caller.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		t.Error("a connection with a call was closed")
	}
}

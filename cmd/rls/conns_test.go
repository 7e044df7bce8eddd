package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCapListener: beyond the cap a connection is accepted and closed at
// once; closing one of those held frees its slot.
func TestCapListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := newConnMetrics(prometheus.NewRegistry())
	l := newCapListener(raw, "grpc-addr", 2, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	// closedAtOnce reports whether the server closed c (a read sees EOF).
	closedAtOnce := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	dial()
	dial()
	held := []net.Conn{<-accepted, <-accepted}
	if third := dial(); !closedAtOnce(third) {
		t.Fatal("the connection beyond the cap was not closed")
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("grpc-addr")); got != 1 {
		t.Errorf("refused = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
	held[0].Close()
	held[0].Close() // twice frees once
	if fourth := dial(); closedAtOnce(fourth) {
		t.Fatal("a connection within the cap (after one closed) was closed")
	}
	<-accepted
	if got := testutil.ToFloat64(m.open.WithLabelValues("grpc-addr")); got != 2 {
		t.Errorf("open = %v, want 2", got)
	}
}

func TestConnFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc-max-streams", "0"}, "--grpc-max-streams (RLS_GRPC_MAX_STREAMS) must be at least 1"},
		{[]string{"--grpc-max-conn-idle", "-1s"}, "--grpc-max-conn-idle (RLS_GRPC_MAX_CONN_IDLE) is negative"},
		{[]string{"--grpc-max-conn-age", "-1s"}, "--grpc-max-conn-age (RLS_GRPC_MAX_CONN_AGE) is negative"},
		{[]string{"--http-idle-timeout", "0"}, "--http-idle-timeout (RLS_HTTP_IDLE_TIMEOUT) must be positive"},
		{[]string{"--max-conns", "-1"}, "--max-conns (RLS_MAX_CONNS) is negative"},
	} {
		_, err := parseConfig(append([]string{"--config-dir", "../../config"}, tc.args...), func(string) string { return "" }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
	c, err := parseConfig([]string{"--config-dir", "../../config"}, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.GRPCMaxStreams != 256 || c.GRPCMaxConnIdle != 5*time.Minute || c.GRPCMaxConnAge != 30*time.Minute ||
		c.HTTPIdleTimeout != time.Minute || c.MaxConns != 1000 {
		t.Errorf("defaults: %+v", c)
	}
}

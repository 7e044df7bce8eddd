package main

import (
	"bufio"
	"strings"
	"testing"
)

func TestCheckLoopback(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:8081", "127.3.2.1:1", "localhost:8081", "LOCALHOST:1", "[::1]:8081", "[::ffff:127.0.0.1]:80"} {
		if err := checkLoopback("addr", ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:8081", "0.0.0.0:8081", ":8081", "[::]:8081", "example.com:8081",
		"localhost.example.com:80", "128.0.0.1:80", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "[fe80::1%lo]:80", "192.168.1.1:8081"} {
		if err := checkLoopback("addr", bad); err == nil {
			t.Errorf("%s: want a refusal", bad)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// Field 2 with spaces and a ')' inside; utime=1500, stime=250.
	stat := "4242 (rls (odd) name) S 1 4242 4242 0 -1 4194560 1234 0 0 0 1500 250 0 0 20 0 12 0 100 123456 789 18446744073709551615\n"
	got, err := parseProcStat([]byte(stat))
	if err != nil || got != 1750 {
		t.Fatalf("got %d, %v", got, err)
	}
	for _, bad := range []string{"", "1 (x S 1 2", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 a b"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

const sampleInfo = "# Server\r\nredis_version:7.0.15\r\n\r\n# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1042\r\n\r\n" +
	"# Memory\r\nused_memory:1038480\r\nused_memory_human:1014.14K\r\n\r\n# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.750000\r\nused_cpu_sys_children:0.000000\r\n\r\n" +
	"# Commandstats\r\ncmdstat_evalsha:calls=1000,usec=5000,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=2,usec=100,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n"

func TestParseRedisInfo(t *testing.T) {
	ri, err := parseRedisInfo(sampleInfo)
	if err != nil {
		t.Fatal(err)
	}
	if ri.cpu != 2 || ri.commands != 1042 || ri.calls["evalsha"] != 1000 || ri.calls["info"] != 2 || ri.conns != 3 || ri.mem != 1038480 {
		t.Fatalf("%+v", ri)
	}
	if _, err := parseRedisInfo("# Stats\r\ntotal_commands_processed:1\r\n"); err == nil {
		t.Fatal("missing cpu: want an error")
	}
	if _, err := parseRedisInfo("used_cpu_sys:x\r\nused_cpu_user:1\r\ntotal_commands_processed:1\r\n"); err == nil {
		t.Fatal("bad float: want an error")
	}
}

func TestReadBulk(t *testing.T) {
	s, err := readBulk(bufio.NewReader(strings.NewReader("$5\r\nhello\r\n")))
	if err != nil || s != "hello" {
		t.Fatalf("%q %v", s, err)
	}
	if _, err := readBulk(bufio.NewReader(strings.NewReader("-NOAUTH Authentication required.\r\n"))); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("want NOAUTH error, got %v", err)
	}
	if _, err := readBulk(bufio.NewReader(strings.NewReader("+OK\r\n"))); err == nil {
		t.Fatal("want an error")
	}
}

package upstream

import "testing"

// TestHelloLen: the HELLO of go-redis's handshake is recognised whole, in
// any case and with its arguments; other commands are not.
func TestHelloLen(t *testing.T) {
	hello := "*4\r\n$5\r\nhello\r\n$1\r\n2\r\n$4\r\nAUTH\r\n$1\r\nx\r\n"
	for _, c := range []struct {
		in   string
		want int
	}{
		{hello, len(hello)},
		{hello + "*1\r\n$4\r\nPING\r\n", len(hello)},
		{"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n", 22},
		{"*1\r\n$4\r\nPING\r\n", 0},
		{"*2\r\n$5\r\nhello", 0},
		{"PING\r\n", 0},
	} {
		if got := helloLen([]byte(c.in)); got != c.want {
			t.Errorf("helloLen(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

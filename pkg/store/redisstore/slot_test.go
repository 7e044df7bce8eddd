package redisstore

import "testing"

func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":         0x31C3 % Slots, // the CRC16/XMODEM check value
		"foo":               12182,          // CLUSTER KEYSLOT foo
		"{user1000}.follow": Slot("user1000"),
		"foo{}{bar}":        8363, // an empty tag hashes the whole key
		"rl:{acme}:x":       Slot("acme"),
		"":                  0,
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"
)

func TestDecideEmbedded(t *testing.T) {
	if !strings.Contains(DecideSource, "redis.call('TIME')") {
		t.Fatal("decide.lua is not embedded")
	}
	sum := sha1.Sum([]byte(DecideSource))
	if got := Decide.Hash(); got != hex.EncodeToString(sum[:]) {
		t.Errorf("Decide.Hash() = %s, want the SHA1 of decide.lua", got)
	}
}

package store

// FloorDiv returns a/b rounded towards negative infinity: the window a
// time falls in (a time before the epoch included).
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

package descriptors

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Unit is a rate-limit time unit. Its values equal Envoy's
// RateLimitResponse_RateLimit_Unit, so a numeric conversion in either
// direction is exact (Envoy's override enum RateLimitUnit lacks UnitWeek).
// The zero value is not a valid unit.
type Unit int32

// The units. Their values are Envoy's enum numbers.
const (
	UnitSecond Unit = 1
	UnitMinute Unit = 2
	UnitHour   Unit = 3
	UnitDay    Unit = 4
	UnitMonth  Unit = 5
	UnitYear   Unit = 6
	UnitWeek   Unit = 7
)

// Seconds returns the unit's length in seconds: a month is 30 days and a
// year 365 days. It returns 0 for an invalid unit.
func (u Unit) Seconds() int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 3600
	case UnitDay:
		return 86400
	case UnitWeek:
		return 7 * 86400
	case UnitMonth:
		return 30 * 86400
	case UnitYear:
		return 365 * 86400
	}
	return 0
}

// String returns the unit's configuration name ("second", "minute", ...), or
// "unknown" for an invalid unit.
func (u Unit) String() string {
	switch u {
	case UnitSecond:
		return "second"
	case UnitMinute:
		return "minute"
	case UnitHour:
		return "hour"
	case UnitDay:
		return "day"
	case UnitWeek:
		return "week"
	case UnitMonth:
		return "month"
	case UnitYear:
		return "year"
	}
	return "unknown"
}

// Valid reports whether u is one of the seven units.
func (u Unit) Valid() bool { return u >= UnitSecond && u <= UnitWeek }

// ParseUnit returns the unit named s, case-insensitively ("minute",
// "MINUTE"). ok is false for any other string.
func ParseUnit(s string) (u Unit, ok bool) {
	for u := UnitSecond; u <= UnitWeek; u++ {
		if strings.EqualFold(s, u.String()) {
			return u, true
		}
	}
	return 0, false
}

// OnError says what a rule wants when the store cannot answer.
type OnError uint8

// The OnError values. The zero value, OnErrorDefault, means the rule said
// nothing and the service applies its --on-store-error setting.
const (
	OnErrorDefault OnError = iota
	OnErrorFailOpen
	OnErrorFailClosed
)

// String returns the configuration name: "fail_open", "fail_closed", or
// "default" for OnErrorDefault.
func (o OnError) String() string {
	switch o {
	case OnErrorFailOpen:
		return "fail_open"
	case OnErrorFailClosed:
		return "fail_closed"
	case OnErrorDefault:
		return "default"
	}
	return "unknown"
}

// MaxWindow is the longest window a rule may have: one year (365 days),
// the longest unit. A longer period made with unit_multiplier is refused,
// in a config file and in a request's override alike: a counter that
// would outlive a year is a mistake far more often than a policy.
const MaxWindow = 365 * 24 * time.Hour

// Window returns the length of mult units (unit_multiplier: 0 and 1 both
// mean one unit). ok is false for an invalid unit and for a window longer
// than MaxWindow; the length is returned all the same (it cannot overflow:
// a year times the largest uint32 is under 2^57 seconds), for messages.
func (u Unit) Window(mult uint32) (secs int64, ok bool) {
	secs = u.Seconds() * int64(max(1, mult))
	return secs, u.Valid() && secs <= int64(MaxWindow/time.Second)
}

// windowText renders a window of secs seconds for messages: "390 days",
// "40000000s (about 462 days)", "2m0s".
func windowText(secs int64) string {
	const day = 86400
	switch {
	case secs >= day && secs%day == 0:
		return strconv.FormatInt(secs/day, 10) + " days"
	case secs >= day:
		return fmt.Sprintf("%ds (about %d days)", secs, secs/day)
	}
	return (time.Duration(secs) * time.Second).String()
}

// WindowError says why mult units of u make no valid window, for a
// multiplier that Window refused: "unit_multiplier 13 with unit month is a
// window of 390 days, longer than one year (365 days)".
func WindowError(u Unit, mult uint32) string {
	if mult == 0 {
		return "must be at least 1 (the number of units in one window), got 0"
	}
	secs, _ := u.Window(mult)
	return fmt.Sprintf("%d with unit %s is a window of %s, longer than one year (365 days)", mult, u, windowText(secs))
}

package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/rls-project/rls/pkg/xds"
)

// xdsFlags declares --config-source and the --xds-* flags: the descriptor
// config from an xDS management server instead of --config-dir.
func xdsFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.ConfigSource, "config-source", "file", "where the descriptor config comes from: file (--config-dir) or xds")
	fs.StringVar(&c.XDSServer, "xds-server", "", "xDS management server, host:port (--config-source xds)")
	fs.StringVar(&c.XDSNodeID, "xds-node-id", "", "node id rls presents to the xDS server (required with xds)")
	fs.StringVar(&c.XDSTLSCA, "xds-tls-ca", "", "PEM CA bundle for the xDS server; any --xds-tls-* flag turns TLS on")
	fs.StringVar(&c.XDSTLSCert, "xds-tls-cert", "", "PEM client certificate for the xDS server, with --xds-tls-key")
	fs.StringVar(&c.XDSTLSKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert")
}

// fromXDS reports whether the config comes over xDS.
func (c *Config) fromXDS() bool { return c.ConfigSource == "xds" }

// xdsTLSSet reports whether any --xds-tls-* flag is set: TLS is on then.
func (c *Config) xdsTLSSet() bool {
	return c.XDSTLSCA != "" || c.XDSTLSCert != "" || c.XDSTLSKey != "" || c.XDSTLSServerName != ""
}

// validateXDS checks --config-source and the --xds-* flags; those are
// refused with --config-source file, where they would do nothing.
func (c *Config) validateXDS() error {
	if err := oneOf("config-source", c.ConfigSource, "file", "xds"); err != nil {
		return err
	}
	if !c.fromXDS() {
		if c.XDSServer != "" || c.XDSNodeID != "" || c.XDSNodeMetadata != "" || c.xdsTLSSet() {
			return fmt.Errorf("the --xds-* flags need %s xds", flagRef("config-source"))
		}
		return nil
	}
	var errs []error
	if c.XDSServer == "" {
		errs = append(errs, fmt.Errorf("%s is required with --config-source xds: the management server's host:port", flagRef("xds-server")))
	} else {
		errs = append(errs, validAddr("xds-server", c.XDSServer, false))
	}
	if c.XDSNodeID == "" {
		errs = append(errs, fmt.Errorf("%s is required with --config-source xds: the node id the management server keys rls's snapshot by", flagRef("xds-node-id")))
	}
	// The node metadata and the message cap have no flag (fixed settings):
	// their errors name the setting, not a flag.
	if _, err := xds.ParseNodeMetadata(c.XDSNodeMetadata); err != nil {
		errs = append(errs, fmt.Errorf("xDS node metadata: %v", err))
	}
	if c.XDSMaxRecvBytes < 1 {
		errs = append(errs, fmt.Errorf("the xDS message cap is %d bytes; it must be at least 1", c.XDSMaxRecvBytes))
	}
	errs = append(errs, validCA("xds-tls-ca", c.XDSTLSCA), validPair("xds-tls-cert", c.XDSTLSCert, "xds-tls-key", c.XDSTLSKey))
	return errors.Join(errs...)
}

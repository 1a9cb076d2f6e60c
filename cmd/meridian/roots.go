package main

// The image holds no CA certificates (no base image, no package
// manager): the binary carries Mozilla's roots, used only where the
// system has none, for JWKS over HTTPS, AWS APIs and OTLP over TLS.
import _ "golang.org/x/crypto/x509roots/fallback"

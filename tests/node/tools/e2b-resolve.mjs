// Preloaded (`node --import`) into a harness that uses the E2B SDK's own address shape: the
// resolver override of the wildcard-host test. Hosts under E2B_TEST_DOMAIN go to
// 127.0.0.1:E2B_TEST_TLS_PORT (the test's TLS front), keeping their name for SNI and the
// certificate check, as wildcard DNS and a proxy on port 443 would.
import tls from 'node:tls'

const suffix = `.${process.env.E2B_TEST_DOMAIN}`
const port = Number(process.env.E2B_TEST_TLS_PORT)
const connect = tls.connect
tls.connect = function (...args) {
  const o = args[0]
  if (o && typeof o === 'object' && typeof o.host === 'string' && o.host.endsWith(suffix)) {
    args[0] = { ...o, host: '127.0.0.1', port, servername: o.servername || o.host }
  }
  return connect.apply(this, args)
}

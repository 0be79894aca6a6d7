//! Fixed newstyle handshake (option haggling) up to the transmission phase.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::NbdError;
use crate::export::{Backend, Export};
use crate::meta::{self, MetaContext, MAX_META_QUERIES};
use crate::protocol::*;
use crate::session::{Negotiated, ServerConfig, READ_BUF};
use crate::tls::{ClientIdentity, TlsMode};
use crate::transport::Channel;

/// Options accepted per handshake before the client is disconnected.
pub(crate) const MAX_OPTIONS: usize = 1000;
/// Option payloads above this are considered abusive: disconnect.
pub(crate) const MAX_OPTION_LEN: u32 = 64 * 1024;
/// The whole handshake must finish within this time.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Block sizes (minimum, preferred, maximum) to advertise and enforce.
pub(crate) fn sanitize_block_sizes(sizes: (u32, u32, u32), config_max: u32) -> (u32, u32, u32) {
    let (min, pref, max) = sizes;
    let cfg_max = config_max.max(512);
    let valid = min.is_power_of_two() && min <= 65536 && pref.is_power_of_two() && pref >= min.max(512) && max >= pref;
    if !valid {
        log::warn!("nbd: export block sizes {sizes:?} are inconsistent, using defaults");
        return (1, 4096.min(prev_pow2(cfg_max)), cfg_max);
    }
    (min, pref, max.min(cfg_max).max(pref))
}

fn prev_pow2(x: u32) -> u32 {
    if x == 0 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

/// Transmission flags for an export.
pub(crate) fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f =
        NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_CACHE | NBD_FLAG_CAN_MULTI_CONN;
    if read_only {
        f |= NBD_FLAG_READ_ONLY;
    } else {
        f |= NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
    }
    if structured {
        f |= NBD_FLAG_SEND_DF;
    }
    f
}

struct State<'a> {
    backend: &'a dyn Backend,
    config: &'a ServerConfig,
    structured: bool,
    /// NBD_OPT_EXTENDED_HEADERS was acknowledged.
    extended: bool,
    /// Export (resolved name) and contexts of the last successful
    /// NBD_OPT_SET_META_CONTEXT.
    meta: Option<(String, Vec<MetaContext>)>,
    out: Vec<u8>,
    /// NBD_OPT_STARTTLS succeeded.
    tls_active: bool,
    /// The verified client certificate's names (mutual TLS).
    identity: Option<ClientIdentity>,
}

enum Next {
    Continue,
    /// NBD_OPT_STARTTLS was acknowledged: run the TLS handshake.
    StartTls(Arc<rustls::ServerConfig>),
    Go(Negotiated),
}

/// Run the handshake on `chan`; returns the session and the channel
/// (upgraded to TLS if the client asked for it).
pub(crate) fn negotiate(
    mut chan: Channel,
    backend: &dyn Backend,
    config: &ServerConfig,
    shutting_down: &AtomicBool,
) -> Result<(Negotiated, Channel), NbdError> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let cflags = greet(&mut chan)?;
    let mut st = State {
        backend,
        config,
        structured: false,
        extended: false,
        meta: None,
        out: Vec::with_capacity(256),
        tls_active: false,
        identity: None,
    };
    let mut n = 0usize;
    loop {
        n += 1;
        if n > MAX_OPTIONS {
            return Err(NbdError::TooManyOptions(n));
        }
        let (hdr, data) = read_option(&mut chan, deadline, &cflags)?;
        st.out.clear();
        if shutting_down.load(Ordering::Relaxed) && hdr.option != NBD_OPT_ABORT {
            return Err(refuse_shutting_down(&mut chan, &mut st.out, hdr.option));
        }
        let next = st.option(hdr.option, &data, cflags.no_zeroes);
        if !st.out.is_empty() {
            chan.write_all(&st.out)?;
        }
        match next? {
            Next::Continue => {}
            Next::StartTls(tls) => {
                chan = chan.start_tls(tls, READ_BUF)?;
                st.tls_started(chan.identity().cloned());
            }
            Next::Go(neg) => {
                chan.sock().set_read_timeout(None)?;
                chan.sock().set_write_timeout(None)?;
                return Ok((neg, chan));
            }
        }
    }
}

/// Send the greeting and read the client's flags, under the handshake
/// timeout (which stays set for the rest of the handshake).
fn greet(chan: &mut Channel) -> Result<ClientFlags, NbdError> {
    chan.sock().set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    chan.sock().set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    chan.write_all(&encode_greeting(SERVER_HANDSHAKE_FLAGS))?;
    let mut raw = [0u8; 4];
    read_exact(chan, &mut raw)?;
    Ok(parse_client_flags(u32::from_be_bytes(raw), SERVER_HANDSHAKE_FLAGS)?)
}

/// The next option and its data, read before `deadline` (the whole
/// handshake's); refuses what this client may not send and oversized data.
fn read_option(
    chan: &mut Channel,
    deadline: Instant,
    cflags: &ClientFlags,
) -> Result<(OptionHeader, Vec<u8>), NbdError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(NbdError::HandshakeTimeout);
    }
    chan.sock().set_read_timeout(Some(remaining))?;
    let mut hb = [0u8; OPTION_HEADER_LEN];
    read_exact(chan, &mut hb)?;
    let hdr = parse_option_header(&hb)?;
    if !cflags.fixed_newstyle && hdr.option != NBD_OPT_EXPORT_NAME {
        // A non-fixed client cannot parse option replies.
        return Err(NbdError::NotFixedNewstyle(hdr.option));
    }
    if hdr.length > MAX_OPTION_LEN {
        return Err(NbdError::OptionTooLong { option: hdr.option, length: hdr.length });
    }
    let mut data = vec![0u8; hdr.length as usize];
    read_exact(chan, &mut data)?;
    log::debug!("nbd: option {} ({} bytes)", hdr.option, hdr.length);
    Ok((hdr, data))
}

/// The server is shutting down: tell the client (best effort) and end the
/// handshake. NBD_OPT_EXPORT_NAME has no error reply, so it only gets the
/// close.
fn refuse_shutting_down(chan: &mut Channel, out: &mut Vec<u8>, option: u32) -> NbdError {
    if option != NBD_OPT_EXPORT_NAME {
        push_option_reply(out, option, NBD_REP_ERR_SHUTDOWN, b"server is shutting down");
        let _ = chan.write_all(out);
    }
    NbdError::ShuttingDown
}

fn read_exact(r: &mut Channel, buf: &mut [u8]) -> Result<(), NbdError> {
    match r.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err(NbdError::HandshakeTimeout)
        }
        Err(e) => Err(e.into()),
    }
}

impl State<'_> {
    fn reply(&mut self, option: u32, reply_type: u32, data: &[u8]) {
        push_option_reply(&mut self.out, option, reply_type, data);
    }

    fn invalid(&mut self, option: u32, why: &str) -> Result<Next, NbdError> {
        log::info!("nbd: invalid option {option}: {why}");
        self.reply(option, NBD_REP_ERR_INVALID, why.as_bytes());
        Ok(Next::Continue)
    }

    /// After a successful TLS handshake: nothing negotiated in plaintext
    /// carries over (proto.md, NBD_OPT_STARTTLS).
    fn tls_started(&mut self, identity: Option<ClientIdentity>) {
        self.tls_active = true;
        self.structured = false;
        self.extended = false;
        self.meta = None;
        if let Some(id) = &identity {
            log::info!("nbd: TLS client certificate names {:?}", id.names);
        }
        self.identity = identity;
    }

    /// In require mode before TLS: refuse every option but STARTTLS and
    /// ABORT (ERR_TLS_REQD; EXPORT_NAME cannot be refused, so close).
    fn tls_gate(&mut self, option: u32) -> Result<Option<Next>, NbdError> {
        let required = self.config.tls.as_ref().is_some_and(|t| t.mode == TlsMode::Require) && !self.tls_active;
        if !required || option == NBD_OPT_STARTTLS || option == NBD_OPT_ABORT {
            return Ok(None);
        }
        if option == NBD_OPT_EXPORT_NAME {
            return Err(NbdError::TlsRequired(option));
        }
        log::info!("nbd: option {option} before STARTTLS refused (TLS required)");
        self.reply(option, NBD_REP_ERR_TLS_REQD, b"TLS is required: send NBD_OPT_STARTTLS first");
        Ok(Some(Next::Continue))
    }

    fn start_tls(&mut self, option: u32, data: &[u8]) -> Result<Next, NbdError> {
        if !data.is_empty() {
            return self.invalid(option, "NBD_OPT_STARTTLS takes no data");
        }
        let Some(tls) = &self.config.tls else {
            self.reply(option, NBD_REP_ERR_POLICY, b"TLS is not enabled on this server");
            return Ok(Next::Continue);
        };
        if self.tls_active {
            return self.invalid(option, "TLS is already active");
        }
        let config = Arc::clone(&tls.rustls);
        self.reply(option, NBD_REP_ACK, &[]);
        Ok(Next::StartTls(config))
    }

    /// Whether the client may see export `name` (the TLS allow-list).
    fn visible(&self, name: &str) -> bool {
        match self.config.tls.as_ref().and_then(|t| t.allow.as_ref()) {
            None => true,
            Some(allow) => allow.permits(self.identity.as_ref(), name),
        }
    }

    /// With an allow-list, every export is TLS-only: a plaintext client
    /// has no certificate to be allowed by.
    fn exports_need_tls(&self) -> bool {
        !self.tls_active && self.config.tls.as_ref().is_some_and(|t| t.allow.is_some())
    }

    /// Resolve the empty name to the default export.
    fn resolve(&self, name: &str) -> Option<String> {
        if name.is_empty() {
            self.backend.default_export()
        } else {
            Some(name.to_owned())
        }
    }

    fn open(&self, name: &str) -> Option<(String, Arc<dyn Export>)> {
        let resolved = self.resolve(name)?;
        if !self.visible(&resolved) {
            let who = self.identity.as_ref().map(|i| i.names.as_slice()).unwrap_or_default();
            log::info!("nbd: export {resolved:?} is not in the allow-list of client {who:?}");
            return None;
        }
        let export = self.backend.open(&resolved)?;
        Some((resolved, export))
    }

    fn negotiated(&self, name: String, export: Arc<dyn Export>) -> Negotiated {
        let size = export.size();
        let (min_block, _, max_payload) = sanitize_block_sizes(export.block_sizes(), self.config.max_request_bytes);
        // The selection only counts for the export it was made for.
        let meta_contexts = match &self.meta {
            Some((m, contexts)) if *m == name => contexts.clone(),
            _ => Vec::new(),
        };
        // Extended headers take precedence over structured replies and
        // imply them (proto.md, NBD_OPT_EXTENDED_HEADERS).
        let structured = self.structured || self.extended;
        Negotiated {
            transmission_flags: transmission_flags(export.read_only(), structured),
            export,
            name,
            size,
            structured,
            extended: self.extended,
            meta_contexts,
            min_block,
            max_payload,
        }
    }

    fn option(&mut self, option: u32, data: &[u8], no_zeroes: bool) -> Result<Next, NbdError> {
        if let Some(refused) = self.tls_gate(option)? {
            return Ok(refused);
        }
        match option {
            NBD_OPT_EXPORT_NAME => {
                if self.extended {
                    // proto.md: once extended headers are negotiated the
                    // client MUST NOT use it, and it has no error reply.
                    return Err(NbdError::ExportNameAfterExtendedHeaders);
                }
                let name = parse_export_name(data)?;
                let Some((name, export)) = self.open(&name) else {
                    return Err(NbdError::UnknownExport(name));
                };
                let neg = self.negotiated(name, export);
                self.out.extend_from_slice(&encode_export_name_reply(neg.size, neg.transmission_flags, no_zeroes));
                log::info!("nbd: export {:?} selected with NBD_OPT_EXPORT_NAME", neg.name);
                Ok(Next::Go(neg))
            }
            NBD_OPT_ABORT => {
                self.reply(option, NBD_REP_ACK, &[]);
                Err(NbdError::Aborted)
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    return self.invalid(option, "NBD_OPT_LIST takes no data");
                }
                let visible: Vec<_> = self.backend.list().into_iter().filter(|e| self.visible(&e.name)).collect();
                for e in visible {
                    let payload = encode_rep_server(&e.name, &e.description);
                    self.reply(option, NBD_REP_SERVER, &payload);
                }
                self.reply(option, NBD_REP_ACK, &[]);
                Ok(Next::Continue)
            }
            NBD_OPT_STARTTLS => self.start_tls(option, data),
            NBD_OPT_INFO | NBD_OPT_GO => self.info(option, data),
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    return self.invalid(option, "NBD_OPT_STRUCTURED_REPLY takes no data");
                }
                if self.extended {
                    self.reply(option, NBD_REP_ERR_EXT_HEADER_REQD, b"extended headers are already negotiated");
                    return Ok(Next::Continue);
                }
                self.structured = true;
                self.reply(option, NBD_REP_ACK, &[]);
                Ok(Next::Continue)
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => self.meta_context(option, data),
            NBD_OPT_EXTENDED_HEADERS => {
                if !data.is_empty() {
                    return self.invalid(option, "NBD_OPT_EXTENDED_HEADERS takes no data");
                }
                self.extended = true;
                self.reply(option, NBD_REP_ACK, &[]);
                Ok(Next::Continue)
            }
            _ => {
                log::debug!("nbd: unsupported option {option}");
                self.reply(option, NBD_REP_ERR_UNSUP, &[]);
                Ok(Next::Continue)
            }
        }
    }

    fn info(&mut self, option: u32, data: &[u8]) -> Result<Next, NbdError> {
        let req = match parse_info_request(data) {
            Ok(r) => r,
            Err(e) => return self.invalid(option, &e.to_string()),
        };
        let Some((name, export)) = self.open(&req.name) else {
            if self.exports_need_tls() {
                // proto.md SELECTIVETLS: INFO/GO on a TLS-only (or missing)
                // export before TLS answers ERR_TLS_REQD.
                self.reply(option, NBD_REP_ERR_TLS_REQD, b"exports need TLS with a client certificate");
            } else {
                self.reply(option, NBD_REP_ERR_UNKNOWN, format!("unknown export {:?}", req.name).as_bytes());
            }
            return Ok(Next::Continue);
        };
        let neg = self.negotiated(name, export);
        self.reply(option, NBD_REP_INFO, &encode_info_export(neg.size, neg.transmission_flags));
        let (min, pref, max) = sanitize_block_sizes(neg.export.block_sizes(), self.config.max_request_bytes);
        self.reply(option, NBD_REP_INFO, &encode_info_block_size(min, pref, max));
        if req.requests.contains(&NBD_INFO_NAME) || req.name != neg.name {
            self.reply(option, NBD_REP_INFO, &encode_info_string(NBD_INFO_NAME, &neg.name));
        }
        if req.requests.contains(&NBD_INFO_DESCRIPTION) {
            if let Some(d) = self.backend.list().into_iter().find(|d| d.name == neg.name) {
                if !d.description.is_empty() {
                    self.reply(option, NBD_REP_INFO, &encode_info_string(NBD_INFO_DESCRIPTION, &d.description));
                }
            }
        }
        self.reply(option, NBD_REP_ACK, &[]);
        if option == NBD_OPT_GO {
            let contexts: Vec<&str> = neg.meta_contexts.iter().map(|c| c.name.as_str()).collect();
            log::info!(
                "nbd: export {:?} selected (size {}, structured {}, extended headers {}, metadata contexts {:?})",
                neg.name,
                neg.size,
                neg.structured,
                neg.extended,
                contexts
            );
            Ok(Next::Go(neg))
        } else {
            Ok(Next::Continue)
        }
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> Result<Next, NbdError> {
        let set = option == NBD_OPT_SET_META_CONTEXT;
        if set {
            // SET replaces the previous selection even when it fails.
            self.meta = None;
        }
        if !self.structured && !self.extended {
            return self.invalid(option, "structured replies or extended headers must be negotiated first");
        }
        let req = match parse_meta_context_request(data) {
            Ok(r) => r,
            Err(e) => return self.invalid(option, &e.to_string()),
        };
        if req.queries.len() > MAX_META_QUERIES {
            log::info!("nbd: option {option} with {} metadata context queries refused", req.queries.len());
            let msg = format!("at most {MAX_META_QUERIES} metadata context queries are accepted");
            self.reply(option, NBD_REP_ERR_TOO_BIG, msg.as_bytes());
            return Ok(Next::Continue);
        }
        let Some((name, export)) = self.open(&req.export_name) else {
            self.reply(option, NBD_REP_ERR_UNKNOWN, format!("unknown export {:?}", req.export_name).as_bytes());
            return Ok(Next::Continue);
        };
        let offered = meta::offered(export.meta_contexts());
        if set {
            let selected = meta::select(&offered, &req.queries);
            for c in &selected {
                self.reply(option, NBD_REP_META_CONTEXT, &encode_rep_meta_context(c.id, &c.name));
            }
            self.meta = Some((name, selected));
        } else {
            // LIST replies carry the reserved context ID 0.
            for c in meta::list(&offered, &req.queries) {
                self.reply(option, NBD_REP_META_CONTEXT, &encode_rep_meta_context(0, c));
            }
        }
        self.reply(option, NBD_REP_ACK, &[]);
        Ok(Next::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes() {
        assert_eq!(sanitize_block_sizes((1, 4096, 32 << 20), 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(sanitize_block_sizes((512, 4096, 64 << 20), 32 << 20), (512, 4096, 32 << 20));
        assert_eq!(sanitize_block_sizes((4096, 4096, 1 << 20), 32 << 20), (4096, 4096, 1 << 20));
        // Inconsistent: preferred below minimum, not powers of two, huge minimum.
        assert_eq!(sanitize_block_sizes((4096, 512, 1 << 20), 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(sanitize_block_sizes((3, 4096, 1 << 20), 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(sanitize_block_sizes((1 << 17, 1 << 17, 1 << 20), 32 << 20), (1, 4096, 32 << 20));
        assert_eq!(sanitize_block_sizes((0, 0, 0), 32 << 20), (1, 4096, 32 << 20));
        // The configured maximum never drops below the preferred size.
        assert_eq!(sanitize_block_sizes((1, 65536, 1 << 20), 4096), (1, 65536, 65536));
    }

    #[test]
    fn flags() {
        let f = transmission_flags(false, true);
        assert_eq!(f & NBD_FLAG_READ_ONLY, 0);
        for bit in [
            NBD_FLAG_HAS_FLAGS,
            NBD_FLAG_SEND_FLUSH,
            NBD_FLAG_SEND_FUA,
            NBD_FLAG_SEND_TRIM,
            NBD_FLAG_SEND_WRITE_ZEROES,
            NBD_FLAG_SEND_FAST_ZERO,
            NBD_FLAG_SEND_DF,
            NBD_FLAG_SEND_CACHE,
            NBD_FLAG_CAN_MULTI_CONN,
        ] {
            assert_ne!(f & bit, 0, "bit {bit:#x}");
        }
        let f = transmission_flags(true, false);
        assert_ne!(f & NBD_FLAG_READ_ONLY, 0);
        assert_eq!(f & (NBD_FLAG_SEND_DF | NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES), 0);
    }
}

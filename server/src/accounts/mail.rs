//! Outgoing mail, off the request path.
//!
//! Requests hand a [`Mail`] to a bounded queue and return at once; one task sends it through
//! the SMTP relay given by `--smtp-url` (lettre: plain, STARTTLS or TLS, credentials from the
//! URL; `--smtp-ca-file` adds authorities to the Mozilla roots for a relay's certificate) or,
//! without one, writes it as an RFC 5322 `.eml` file under `DATA_DIR/outbox/` with one log
//! line saying where. Failures are retried with backoff and end in one clear log line.
//! Message bodies (which carry login codes) are never logged.

use lettre::message::{header::ContentType, Mailbox};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Mails waiting to be sent; beyond this, new mail is dropped with an error log.
const QUEUE: usize = 1024;
/// Attempts per mail, with the waits between them.
const BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(4)];

#[derive(Debug)]
pub(crate) struct Mail {
    /// A canonical address (see `email.rs`): exactly one recipient.
    pub to: String,
    pub subject: String,
    pub body: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MailError {
    #[error("invalid SMTP URL")]
    Url(#[from] lettre::transport::smtp::Error),
    #[error("cannot create the outbox directory")]
    Io(#[from] std::io::Error),
    #[error("--smtp-ca-file {0}: {1}")]
    CaFile(PathBuf, std::io::Error),
    #[error("--smtp-ca-file {0}: no PEM certificate in it")]
    BadCa(PathBuf),
    #[error(
        "--smtp-ca-file is for a relay reached over TLS: smtps://, or smtp:// with ?tls=required \
         (or ?tls=opportunistic)"
    )]
    CaWithoutTls,
}

/// The relay `url` names, trusting the authorities in `ca` (PEM) besides the Mozilla roots
/// lettre ships with (a relay with a private authority's certificate).
fn smtp_transport(
    url: &str,
    ca: Option<&Path>,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, MailError> {
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    let mut builder =
        AsyncSmtpTransport::<Tokio1Executor>::from_url(url)?.timeout(Some(SMTP_TIMEOUT));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|e| MailError::CaFile(ca.to_owned(), e))?;
        let roots = Certificate::from_pem(&pem).map_err(|_| MailError::BadCa(ca.to_owned()))?;
        // lettre read the same URL above: it parses, and names a host.
        let parsed = url::Url::parse(url).map_err(|_| MailError::CaWithoutTls)?;
        let host = parsed.host_str().unwrap_or_default().to_owned();
        let params = TlsParameters::builder(host)
            .add_root_certificate(roots)
            .build()?;
        let tls = parsed
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.into_owned());
        builder = builder.tls(match (parsed.scheme(), tls.as_deref()) {
            ("smtps", _) => Tls::Wrapper(params),
            ("smtp", Some("required")) => Tls::Required(params),
            ("smtp", Some("opportunistic")) => Tls::Opportunistic(params),
            _ => return Err(MailError::CaWithoutTls),
        });
    }
    Ok(builder.build())
}

enum Transport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Outbox(PathBuf),
}

#[derive(Clone)]
pub(crate) struct Mailer {
    tx: mpsc::Sender<Mail>,
}

impl Mailer {
    /// Starts the sending task. `from` is the sender address.
    pub(crate) fn start(
        smtp_url: Option<&str>,
        smtp_ca: Option<&Path>,
        outbox: PathBuf,
        from: Mailbox,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Mailer, MailError> {
        let transport = match smtp_url {
            Some(url) => Transport::Smtp(smtp_transport(url, smtp_ca)?),
            None => {
                std::fs::create_dir_all(&outbox)?;
                Transport::Outbox(outbox)
            }
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        tracker.spawn(run(transport, from, rx, shutdown));
        Ok(Mailer { tx })
    }

    /// Queues a mail without waiting.
    pub(crate) fn send(&self, mail: Mail) {
        if self.tx.try_send(mail).is_err() {
            tracing::error!("mail queue full or closed: a mail was dropped");
        }
    }
}

/// One SMTP conversation step may take this long (lettre's default is a minute).
const SMTP_TIMEOUT: Duration = Duration::from_secs(10);
/// At shutdown, queued mail gets this long to go out.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

async fn run(
    transport: Transport,
    from: Mailbox,
    mut rx: mpsc::Receiver<Mail>,
    shutdown: CancellationToken,
) {
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let mail = match deadline {
            Some(_) => rx.recv().await,
            None => tokio::select! {
                m = rx.recv() => m,
                () = shutdown.cancelled() => {
                    // Send what is already queued, within the grace period, then stop.
                    rx.close();
                    deadline = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
                    rx.recv().await
                }
            },
        };
        let Some(mail) = mail else { break };
        let message = match build(&from, &mail) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "cannot build mail; not sent");
                continue;
            }
        };
        match deadline {
            None => {
                let grace_over = async {
                    shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                };
                tokio::select! {
                    () = deliver(&transport, &message, &mail.to) => {}
                    () = grace_over => {
                        tracing::error!(left = 1 + rx.len(), "shutting down: queued mail was not sent");
                        break;
                    }
                }
            }
            Some(at) => {
                let sent =
                    tokio::time::timeout_at(at, deliver(&transport, &message, &mail.to)).await;
                if sent.is_err() {
                    let left = 1 + rx.len();
                    tracing::error!(left, "shutting down: queued mail was not sent");
                    break;
                }
            }
        }
    }
}

fn build(from: &Mailbox, mail: &Mail) -> Result<Message, lettre::error::Error> {
    let to: Mailbox = match mail.to.parse() {
        Ok(m) => m,
        Err(_) => return Err(lettre::error::Error::MissingTo),
    };
    Message::builder()
        .from(from.clone())
        .to(to)
        .subject(mail.subject.clone())
        .header(ContentType::TEXT_PLAIN)
        .body(mail.body.clone())
}

async fn deliver(transport: &Transport, message: &Message, to: &str) {
    let mut attempt = 0;
    loop {
        let result = match transport {
            Transport::Smtp(smtp) => smtp
                .send(message.clone())
                .await
                .map(|_| None)
                .map_err(|e| e.to_string()),
            Transport::Outbox(dir) => write_eml(dir, message)
                .await
                .map(Some)
                .map_err(|e| e.to_string()),
        };
        match result {
            Ok(Some(path)) => {
                tracing::info!(to, path = %path.display(), "mail written to the dev outbox");
                return;
            }
            Ok(None) => {
                tracing::info!(to, "mail sent");
                return;
            }
            Err(e) if attempt < BACKOFF.len() => {
                tracing::warn!(to, error = %e, attempt = attempt + 1, "mail not sent, retrying");
                tokio::time::sleep(BACKOFF[attempt]).await;
                attempt += 1;
            }
            Err(e) => {
                tracing::error!(to, error = %e, "mail could not be sent; giving up");
                return;
            }
        }
    }
}

async fn write_eml(dir: &std::path::Path, message: &Message) -> std::io::Result<PathBuf> {
    let name = format!(
        "{}-{}.eml",
        crate::clock::system_now_ms(),
        uuid::Uuid::new_v4().simple()
    );
    let path = dir.join(name);
    let tmp = path.with_extension("eml.tmp");
    tokio::fs::write(&tmp, message.formatted()).await?;
    // Appears whole or not at all for whoever watches the directory.
    tokio::fs::rename(&tmp, &path).await?;
    Ok(path)
}

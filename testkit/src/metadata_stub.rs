//! [`MetadataStub`]: a loopback stand-in for an instance metadata service
//! that answers each path with whatever text a test sets (or 404), for the
//! property tests of the clouds' metadata parsers. Plain HTTP/1.1, one
//! request per connection, on a thread of its own.
//!
//! One stub serves a whole test file, whose cases run one at a time:
//! [`MetadataStub::serve`] holds the answers, and the other cases off,
//! until its guard is dropped. With the `proptest` feature, [`answers`]
//! has the strategies of those answers both clouds' tests draw from.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// IMDSv2's session token path: a `PUT` there is always answered, so an
/// AWS client gets its token whatever a case serves.
const IMDS_TOKEN_PATH: &str = "/latest/api/token";

pub struct MetadataStub {
    url: String,
    answers: Arc<Mutex<HashMap<String, String>>>,
    case: Mutex<()>,
}

impl MetadataStub {
    /// A stub on a free loopback port whose paths are under `base` (`""`
    /// for the whole path, as AWS's; `/1.0/meta-data/` for BCE's).
    pub fn start(base: &str) -> MetadataStub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("a bound listener's address");
        let answers = Arc::new(Mutex::new(HashMap::new()));
        let served = answers.clone();
        let base = base.to_string();
        let url = format!("http://{addr}{base}");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(stream, &base, &served);
            }
        });
        MetadataStub {
            url,
            answers,
            case: Mutex::new(()),
        }
    }

    /// The base URL, as a metadata client takes it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves `answers` (path under the base to its text) until the guard
    /// is dropped; the other cases wait for it.
    pub fn serve(&self, answers: HashMap<String, String>) -> MutexGuard<'_, ()> {
        // A failed case poisons the lock; the next one serves its own
        // answers anyway.
        let case = self.case.lock().unwrap_or_else(PoisonError::into_inner);
        *self.answers.lock().unwrap_or_else(PoisonError::into_inner) = answers;
        case
    }
}

/// Reads one request's head and answers it; the connection then closes.
fn answer(mut stream: TcpStream, base: &str, answers: &Mutex<HashMap<String, String>>) {
    if stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .is_err()
    {
        return;
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let found = match (method, path) {
        ("PUT", IMDS_TOKEN_PATH) => Some("token-1".to_string()),
        _ => path.strip_prefix(base).and_then(|p| {
            let answers = answers.lock().unwrap_or_else(PoisonError::into_inner);
            answers.get(p).cloned()
        }),
    };
    let (status, body) = match found {
        Some(body) => ("200 OK", body),
        None => ("404 Not Found", String::new()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Strategies of metadata answers (any text, MAC-like text, listings of
/// plausible entries mixed with junk) and the check of a parser's error.
/// The proptest settings ([`answers::cases`]) serve every property test
/// of untrusted input.
#[cfg(feature = "proptest")]
pub mod answers {
    use std::fmt::Display;
    use std::ops::Range;

    use proptest::collection::vec;
    use proptest::prelude::*;

    /// `cases` small cases, none of them kept on disk: no regression files
    /// in the tree (a failing case is kept as a regular test instead).
    pub fn cases(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Any short text: printable, with control characters, or of the
    /// characters addresses are written with.
    pub fn wild_string() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,24}",
            "(?s:.{0,24})",
            "[0-9a-f:./\\-+ \\r\\n\\x00]{0,24}",
        ]
    }

    /// MAC-like text: five to seven octets of two hex digits, or of a sign,
    /// a space or one digit, joined by ':' or '-'.
    pub fn mac_text() -> impl Strategy<Value = String> {
        let octet = prop_oneof![
            4 => "[0-9a-fA-F]{2}",
            1 => "[+\\- ][0-9a-f]",
            1 => "[0-9a-f]{1,3}",
        ];
        (vec(octet, 5..8), prop_oneof![Just(":"), Just("-")]).prop_map(|(o, sep)| o.join(sep))
    }

    /// The check of an error a metadata parser gives: `path` is the path
    /// `e` names (`None`: `e` is no parse error, e.g. a transport failure,
    /// which the stub, always answering, never causes), and it must lie
    /// under `under`.
    pub fn assert_path_under(
        e: &dyn Display,
        path: Option<&str>,
        under: &str,
    ) -> Result<(), TestCaseError> {
        match path {
            Some(path) => prop_assert!(path.starts_with(under), "{}", e),
            None => prop_assert!(false, "not a parse error: {}", e),
        }
        Ok(())
    }

    /// A listing of `lines` lines: plausible entries and junk, with the
    /// blank lines, trailing '/' and CRLFs real listings have.
    pub fn listing(
        entry: impl Strategy<Value = String>,
        lines: Range<usize>,
    ) -> impl Strategy<Value = String> {
        let line = prop_oneof![4 => entry, 1 => wild_string(), 1 => Just(String::new())];
        (
            vec(line, lines),
            prop_oneof![Just("\n"), Just("\r\n"), Just("/\n")],
        )
            .prop_map(|(lines, end)| lines.join(end))
    }

    /// The entries a listing written `text` holds, as a parser must read
    /// them: each non-blank line, white space and the trailing '/' off.
    pub fn entries(text: &str) -> Vec<&str> {
        text.lines()
            .map(|l| l.trim().trim_end_matches('/'))
            .filter(|l| !l.is_empty())
            .collect()
    }
}

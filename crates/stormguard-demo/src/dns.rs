//! A DNS server on loopback whose records a test or an example changes while it runs.
//!
//! DNS discovery is checked against a real server over real UDP, not a mocked resolver:
//! this one answers A and AAAA queries for one name with the records it holds now, with a
//! given TTL, NXDOMAIN for any other name, and can stop answering (a DNS server that is
//! down: queries time out). It counts the queries it answered.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

#[derive(Debug)]
struct Zone {
    records: Vec<IpAddr>,
    ttl: u32,
}

#[derive(Debug)]
struct State {
    name: Name,
    zone: Mutex<Zone>,
    answering: AtomicBool,
    queries: AtomicU64,
}

/// The server: answers while a clone of it lives.
#[derive(Clone, Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    state: Arc<State>,
    _task: Arc<tokio::task::JoinHandle<()>>,
}

impl DnsServer {
    /// A server on `127.0.0.1` (any free port) answering for `name` with `records`, valid
    /// for `ttl_secs`.
    pub async fn start(
        name: &str,
        records: impl IntoIterator<Item = IpAddr>,
        ttl_secs: u32,
    ) -> std::io::Result<DnsServer> {
        let mut name = Name::from_ascii(name)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
            .to_lowercase();
        name.set_fqdn(true);
        let socket = UdpSocket::bind("127.0.0.1:0").await?;
        let addr = socket.local_addr()?;
        let state = Arc::new(State {
            name,
            zone: Mutex::new(Zone {
                records: records.into_iter().collect(),
                ttl: ttl_secs,
            }),
            answering: AtomicBool::new(true),
            queries: AtomicU64::new(0),
        });
        let task = tokio::spawn(serve(socket, Arc::clone(&state)));
        Ok(DnsServer {
            addr,
            state,
            _task: Arc::new(task),
        })
    }

    /// Where it listens (UDP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The records it answers with from now on.
    pub fn set_records(&self, records: impl IntoIterator<Item = IpAddr>) {
        self.zone().records = records.into_iter().collect();
    }

    /// The records it answers with now.
    pub fn records(&self) -> Vec<IpAddr> {
        self.zone().records.clone()
    }

    /// Whether it answers (false: queries are dropped, as by a server that is down).
    pub fn set_answering(&self, answering: bool) {
        self.state.answering.store(answering, Ordering::SeqCst);
    }

    /// Queries answered so far.
    pub fn queries(&self) -> u64 {
        self.state.queries.load(Ordering::SeqCst)
    }

    fn zone(&self) -> std::sync::MutexGuard<'_, Zone> {
        self.state
            .zone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        if Arc::strong_count(&self._task) == 1 {
            self._task.abort();
        }
    }
}

async fn serve(socket: UdpSocket, state: Arc<State>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        if !state.answering.load(Ordering::SeqCst) {
            continue;
        }
        let Some(reply) = answer(&state, &buf[..n]) else {
            continue;
        };
        state.queries.fetch_add(1, Ordering::SeqCst);
        let _ = socket.send_to(&reply, from).await;
    }
}

/// The reply to one query, or `None` for bytes that are not a query.
fn answer(state: &State, query: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(query).ok()?;
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.authoritative = true;
    let (records, ttl) = {
        let zone = state.zone.lock().unwrap_or_else(PoisonError::into_inner);
        (zone.records.clone(), zone.ttl)
    };
    for q in &query.queries {
        reply.add_query(q.clone());
        let mut asked = q.name.to_lowercase();
        asked.set_fqdn(true);
        if asked != state.name {
            reply.metadata.response_code = ResponseCode::NXDomain;
            continue;
        }
        for ip in &records {
            let rdata = match (ip, q.query_type) {
                (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                _ => continue,
            };
            reply.add_answer(Record::from_rdata(q.name.clone(), ttl, rdata));
        }
    }
    debug_assert_eq!(reply.metadata.message_type, MessageType::Response);
    reply.to_vec().ok()
}

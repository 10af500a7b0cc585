//! The reverse proxy: every request that is not a fast-path upload goes to the Python app unchanged, so its
//! routes, error answers (413, 415, 400, ...) and headers keep one implementation.
//!
//! Bodies stream both ways (hyper's `Incoming` is passed through, never collected). Hop-by-hop headers
//! (RFC 9110 §7.6.1: Connection and the headers it names, Keep-Alive, Proxy-Connection, TE, Trailer,
//! Transfer-Encoding, Upgrade) are dropped in both directions, each side framing its own message; Host is
//! kept as the client sent it. `Expect` is dropped too: hyper already answered the client's 100-continue.
//! An app that does not begin its answer within `upstream_timeout` gets the client a 504 `upstream_timeout`
//! (a hung app must not hold the client's connection, and a place among `max_connections`, for ever).

use std::sync::atomic::Ordering::Relaxed;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName};
use hyper::{Request, Response, StatusCode, Uri, Version};

use crate::server::{json_error, AnyBody, Shared};

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

fn drop_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

pub async fn forward(req: Request<Incoming>, shared: &Shared) -> Response<AnyBody> {
    let Some(upstream) = shared.config.upstream.as_deref() else {
        return json_error(StatusCode::NOT_FOUND, "not_found", "no such endpoint");
    };
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match format!("http://{upstream}{path}").parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "unusable request target",
            )
        }
    };
    parts.version = Version::HTTP_11;
    drop_hop_by_hop(&mut parts.headers);
    let pending = shared.client.request(Request::from_parts(parts, body));
    match tokio::time::timeout(shared.config.upstream_timeout, pending).await {
        Err(_) => {
            // a hung app (a blocked event loop, a deadlock) must not hold the client's connection for ever;
            // dropping the request closes its upstream connection
            shared.stats.proxy_timeouts.fetch_add(1, Relaxed);
            json_error(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                &format!(
                    "the collector's app did not answer within {:.3} s; retry later",
                    shared.config.upstream_timeout.as_secs_f64()
                ),
            )
        }
        Ok(Ok(resp)) => {
            shared.stats.proxied.fetch_add(1, Relaxed);
            let (mut parts, body) = resp.into_parts();
            drop_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
        }
        Ok(Err(e)) => {
            shared.stats.proxy_errors.fetch_add(1, Relaxed);
            json_error(
                StatusCode::BAD_GATEWAY,
                "upstream_unavailable",
                &format!("the collector's app did not answer: {e}"),
            )
        }
    }
}

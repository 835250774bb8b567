//! The console's guard (docs/operations.md#console): every request passes it. The token when
//! one is set; without one, only requests addressed to an IP address or `localhost` (DNS
//! rebinding); on an action, the console's header and no other site's `Origin`; the security
//! headers on every answer; and every refusal as JSON, made here only ([`refusal`]).

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde::Serialize;

use super::{ACTION_HEADER, AppState, CONTENT_SECURITY_POLICY};
use crate::core::Error;

/// Every request: the token when one is set (without one, a request addressed to a name
/// other than `localhost` is refused), the action header on a POST (and no other site's
/// `Origin`), and the security headers on every answer; every refusal as JSON.
pub(super) async fn guard(
    State(shared): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let token = shared.config.token.as_deref();
    let host = addressed_to(&request).map(str::to_owned);
    let mut response = if token.is_none() && !addressed_by_ip_or_localhost(host.as_deref()) {
        refusal_with(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "without a token the console answers requests to an IP address or localhost only (a page of another name could be resolved to it); set --auth-token-file to reach it by name",
        )
    } else if !authorized(token, request.headers()) {
        let mut response = refusal_with(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "the console needs the broker's token (any user name, the token as password)",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"tinybroker console\", charset=\"UTF-8\""),
        );
        response
    } else if request.method() == Method::POST
        && (request
            .headers()
            .get(ACTION_HEADER)
            .map(HeaderValue::as_bytes)
            != Some(b"1")
            || !same_origin(request.headers(), host.as_deref()))
    {
        refusal_with(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "an action needs the header x-tinybroker-console: 1 and no other site's Origin (the console's own page sends it)",
        )
    } else {
        as_json(next.run(request).await).await
    };
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// The name and port a request is addressed to: the authority of an absolute-form target
/// (RFC 9112: it wins over `Host`), else its one `Host` header (none with two).
pub fn addressed_to(request: &Request) -> Option<&str> {
    if let Some(authority) = request.uri().authority() {
        return Some(authority.as_str());
    }
    let mut hosts = request.headers().get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().ok(),
        _ => None,
    }
}

/// Whether `host` (a request's [`addressed_to`]) is an IP address or `localhost`, any port:
/// a page of another name resolved to the console's address (DNS rebinding) is not.
pub fn addressed_by_ip_or_localhost(host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    if let Some(bracketed) = host.strip_prefix('[') {
        return bracketed.split_once(']').is_some_and(|(ip, rest)| {
            ip.parse::<std::net::Ipv6Addr>().is_ok()
                && (rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port))
        });
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn is_port(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u16>().is_ok()
}

/// Whether the request's `Origin`, when it has one (and only one), is the console itself:
/// `host`, the request's [`addressed_to`].
pub fn same_origin(headers: &HeaderMap, host: Option<&str>) -> bool {
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let origin = match (origins.next(), origins.next()) {
        (None, _) => return true,
        (Some(origin), None) => origin,
        (Some(_), Some(_)) => return false,
    };
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.trim_end_matches('/'));
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// A refusal made by the HTTP layer (a malformed query or path, a method the path does not
/// take) as JSON like the console's own; other answers unchanged.
async fn as_json(response: Response) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return response;
    }
    let code = match status {
        StatusCode::BAD_REQUEST => "INVALID_ARGUMENT",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::METHOD_NOT_ALLOWED => "UNIMPLEMENTED",
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::FORBIDDEN => "PERMISSION_DENIED",
        s if s.is_server_error() => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    };
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let message = if text.trim().is_empty() {
        status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase()
    } else {
        text.trim().to_string()
    };
    refusal_with(status, code, &message)
}

/// Whether `headers` carry `token` (always, without one): `Authorization: Bearer <token>`, or
/// HTTP Basic with the token as password. Compared in time independent of where they differ.
pub fn authorized(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
    let offered = if scheme.eq_ignore_ascii_case("Bearer") {
        credentials.trim().as_bytes().to_vec()
    } else if scheme.eq_ignore_ascii_case("Basic") {
        let basic = credentials;
        use base64::Engine as _;
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
            return false;
        };
        match decoded.iter().position(|&b| b == b':') {
            Some(colon) => decoded[colon + 1..].to_vec(),
            None => return false,
        }
    } else {
        return false;
    };
    constant_time_eq(&offered, token.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A refusal as JSON: `{"error": ..., "code": ...}`.
#[derive(Serialize)]
pub(super) struct Refusal<'a> {
    pub(super) error: &'a str,
    pub(super) code: &'a str,
}

pub(super) fn refusal_with(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(Refusal {
            error: message,
            code,
        }),
    )
        .into_response()
}

/// The one place a broker's refusal becomes an HTTP answer: the gRPC code's name, and the
/// HTTP status that code maps to.
pub fn refusal(error: &Error) -> Response {
    use tonic::Code;
    let status = crate::service::status::status(error);
    let http = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refusal_with(http, code_name(status.code()), status.message())
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn the_token_is_taken_as_bearer_or_as_a_basic_password_and_nothing_else() {
        use base64::Engine as _;
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(authorized(None, &HeaderMap::new()));
        assert!(!authorized(Some("s3cret"), &HeaderMap::new()));
        assert!(authorized(Some("s3cret"), &headers("Bearer s3cret")));
        assert!(!authorized(Some("s3cret"), &headers("Bearer s3cre")));
        assert!(!authorized(Some("s3cret"), &headers("Bearer s3cretX")));
        assert!(authorized(
            Some("s3cret"),
            &headers(&basic("anyone:s3cret"))
        ));
        assert!(authorized(Some("s3cret"), &headers(&basic(":s3cret"))));
        assert!(!authorized(Some("s3cret"), &headers(&basic("s3cret"))));
        assert!(!authorized(Some("s3cret"), &headers(&basic("s3cret:"))));
        assert!(!authorized(Some("s3cret"), &headers("Basic !!!not-base64")));
        assert!(!authorized(Some("s3cret"), &headers("s3cret")));
        assert!(authorized(Some("s3cret"), &headers("bearer s3cret")));
        let upper = basic("u:s3cret").replace("Basic", "BASIC");
        assert!(authorized(Some("s3cret"), &headers(&upper)));
    }

    #[test]
    fn without_a_token_only_an_ip_address_or_localhost_is_answered() {
        let host = |h: &str| addressed_by_ip_or_localhost(Some(h));
        for ok in [
            "127.0.0.1:50080",
            "127.0.0.1",
            "LOCALHOST:8080",
            "[::1]:50080",
            "[::1]",
            "10.1.2.3:80",
        ] {
            assert!(host(ok), "{ok}");
        }
        for refused in [
            "attacker.example:50080",
            "attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io:80",
            "[::1]x",
            "127.0.0.1:abc",
            "",
        ] {
            assert!(!host(refused), "{refused}");
        }
        assert!(!host("127.0.0.1:99999"));
        assert!(!host("127.0.0.1:"));
        assert!(!addressed_by_ip_or_localhost(None));
        // The authority of an absolute-form target wins over Host; two Hosts are none.
        let request = |target: &str, hosts: &[&str]| {
            let mut builder = axum::http::Request::builder().uri(target);
            for h in hosts {
                builder = builder.header(header::HOST, *h);
            }
            builder.body(axum::body::Body::empty()).unwrap()
        };
        let absolute = request("http://evil.example/api/overview", &["127.0.0.1"]);
        assert_eq!(addressed_to(&absolute), Some("evil.example"));
        let two = request("/api/overview", &["127.0.0.1", "evil.example"]);
        assert_eq!(addressed_to(&two), None);
        let one = request("/api/overview", &["127.0.0.1:50080"]);
        assert_eq!(addressed_to(&one), Some("127.0.0.1:50080"));
    }

    #[test]
    fn an_action_from_another_origin_is_refused() {
        let headers = |origin: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(origin) = origin {
                headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            }
            headers
        };
        let same_origin = |h: &HeaderMap| same_origin(h, Some("127.0.0.1:50080"));
        let mut two = headers(Some("http://127.0.0.1:50080"));
        two.append(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:50080"),
        );
        assert!(!same_origin(&two));
        assert!(same_origin(&headers(None)));
        assert!(same_origin(&headers(Some("http://127.0.0.1:50080"))));
        assert!(!same_origin(&headers(Some(
            "http://attacker.example:50080"
        ))));
        assert!(!same_origin(&headers(Some("null"))));
    }
}

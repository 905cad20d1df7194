//! The selector grammar: a lexer and a recursive-descent parser, linear in the input, as
//! the API server's `labels.Parse` reads selectors.

use std::collections::HashSet;

use super::{MAX_SELECTOR_TERMS, Operator, ParseError, Requirement, Selector};

/// The lexical pieces of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    Comma,
    OpenParen,
    CloseParen,
    End,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Token::Ident(s) => format!("{s:?}"),
            Token::Bang => "\"!\"".into(),
            Token::Equals => "\"=\"".into(),
            Token::DoubleEquals => "\"==\"".into(),
            Token::NotEquals => "\"!=\"".into(),
            Token::GreaterThan => "\">\"".into(),
            Token::LessThan => "\"<\"".into(),
            Token::In => "\"in\"".into(),
            Token::NotIn => "\"notin\"".into(),
            Token::Comma => "\",\"".into(),
            Token::OpenParen => "\"(\"".into(),
            Token::CloseParen => "\")\"".into(),
            Token::End => "the end of the selector".into(),
        }
    }
}

/// A recursive-descent parser over a pre-lexed token list.
pub(super) struct Parser<'a> {
    input: &'a str,
    tokens: Vec<(usize, Token)>,
    next: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn new(input: &'a str) -> Self {
        Parser {
            input,
            tokens: lex(input),
            next: 0,
        }
    }

    fn error(&self, position: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            selector: self.input.to_string(),
            position,
            message: message.into(),
        }
    }

    fn peek(&self) -> &(usize, Token) {
        &self.tokens[self.next.min(self.tokens.len() - 1)]
    }

    fn advance(&mut self) -> (usize, Token) {
        let token = self.peek().clone();
        self.next += 1;
        token
    }

    pub(super) fn parse(mut self) -> Result<Selector, ParseError> {
        let mut requirements = Vec::new();
        if self.peek().1 == Token::End {
            return Ok(Selector { requirements });
        }
        loop {
            if requirements.len() == MAX_SELECTOR_TERMS {
                let at = self.peek().0;
                return Err(self.error(
                    at,
                    format!("more than {MAX_SELECTOR_TERMS} requirements; select on fewer labels"),
                ));
            }
            requirements.push(self.requirement()?);
            match self.advance() {
                (_, Token::End) => return Ok(Selector { requirements }),
                (_, Token::Comma) => {}
                (pos, other) => {
                    return Err(self.error(
                        pos,
                        format!("expected \",\" or the end, found {}", other.describe()),
                    ));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, ParseError> {
        let negated = self.peek().1 == Token::Bang;
        if negated {
            self.advance();
        }
        let key = self.key()?;
        if negated {
            return Ok(Requirement {
                key,
                operator: Operator::DoesNotExist,
                values: Vec::new(),
            });
        }
        let (pos, token) = self.peek().clone();
        let operator = match token {
            Token::Comma | Token::End => {
                return Ok(Requirement {
                    key,
                    operator: Operator::Exists,
                    values: Vec::new(),
                });
            }
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::NotEquals => Operator::NotEquals,
            Token::In => Operator::In,
            Token::NotIn => Operator::NotIn,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            other => {
                return Err(self.error(
                    pos,
                    format!(
                        "expected an operator (=, ==, !=, in, notin, >, <), \",\" or the end after key {key:?}, found {}",
                        other.describe()
                    ),
                ));
            }
        };
        self.advance();
        let values = match operator {
            Operator::In | Operator::NotIn => self.value_set(operator)?,
            Operator::GreaterThan | Operator::LessThan => vec![self.integer()?],
            _ => vec![self.single_value()?],
        };
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }

    fn key(&mut self) -> Result<String, ParseError> {
        match self.advance() {
            (pos, Token::Ident(key)) => {
                validate_key(&key).map_err(|m| self.error(pos, m))?;
                Ok(key)
            }
            (pos, other) => Err(self.error(
                pos,
                format!("expected a label key, found {}", other.describe()),
            )),
        }
    }

    /// The value after `=`, `==` or `!=`; it may be empty (`a=` matches an empty value).
    fn single_value(&mut self) -> Result<String, ParseError> {
        match self.peek().clone() {
            (_, Token::Comma | Token::End) => Ok(String::new()),
            (pos, Token::Ident(value)) => {
                self.advance();
                validate_value(&value).map_err(|m| self.error(pos, m))?;
                Ok(value)
            }
            (pos, other) => Err(self.error(
                pos,
                format!("expected a label value, found {}", other.describe()),
            )),
        }
    }

    fn integer(&mut self) -> Result<String, ParseError> {
        match self.advance() {
            (pos, Token::Ident(value)) => match value.parse::<i64>() {
                Ok(_) => Ok(value),
                Err(_) => Err(self.error(
                    pos,
                    format!("expected an integer after \">\" or \"<\", found {value:?}"),
                )),
            },
            (pos, other) => Err(self.error(
                pos,
                format!("expected an integer, found {}", other.describe()),
            )),
        }
    }

    /// `(v1, v2, ...)` after `in`/`notin`; at least one value, empty entries allowed.
    fn value_set(&mut self, operator: Operator) -> Result<Vec<String>, ParseError> {
        let name = if operator == Operator::In {
            "in"
        } else {
            "notin"
        };
        match self.advance() {
            (_, Token::OpenParen) => {}
            (pos, other) => {
                return Err(self.error(
                    pos,
                    format!(
                        "expected \"(\" after \"{name}\", found {}",
                        other.describe()
                    ),
                ));
            }
        }
        if let (pos, Token::CloseParen) = self.peek().clone() {
            return Err(self.error(
                pos,
                format!("\"{name}\" needs at least one value in its parentheses"),
            ));
        }
        let mut values = Vec::new();
        // Duplicates are dropped, keeping the first: a set so that many values stay linear.
        let mut seen = HashSet::new();
        loop {
            // A value, or nothing (an empty value) before "," or ")".
            let value = match self.peek().clone() {
                (pos, Token::Ident(value)) => {
                    self.advance();
                    validate_value(&value).map_err(|m| self.error(pos, m))?;
                    value
                }
                _ => String::new(),
            };
            if seen.insert(value.clone()) {
                values.push(value);
            }
            match self.advance() {
                (_, Token::Comma) => {}
                (_, Token::CloseParen) => return Ok(values),
                (pos, other) => {
                    return Err(self.error(
                        pos,
                        format!(
                            "expected \",\" or \")\" in the values of \"{name}\", found {}",
                            other.describe()
                        ),
                    ));
                }
            }
        }
    }
}

/// Characters that end an identifier (besides whitespace).
fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | ',' | '(' | ')' | '<' | '>')
}

fn lex(input: &str) -> Vec<(usize, Token)> {
    let mut tokens = Vec::new();
    let mut chars = input.char_indices().peekable();
    while let Some(&(pos, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        chars.next();
        let next_is_eq = chars.peek().is_some_and(|&(_, c)| c == '=');
        let token = match c {
            '!' if next_is_eq => {
                chars.next();
                Token::NotEquals
            }
            '!' => Token::Bang,
            '=' if next_is_eq => {
                chars.next();
                Token::DoubleEquals
            }
            '=' => Token::Equals,
            '>' => Token::GreaterThan,
            '<' => Token::LessThan,
            ',' => Token::Comma,
            '(' => Token::OpenParen,
            ')' => Token::CloseParen,
            _ => {
                let mut ident = String::from(c);
                while let Some(&(_, c)) = chars.peek() {
                    if c.is_whitespace() || is_special(c) {
                        break;
                    }
                    ident.push(c);
                    chars.next();
                }
                match ident.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(ident),
                }
            }
        };
        tokens.push((pos, token));
    }
    tokens.push((input.len(), Token::End));
    tokens
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters.
fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let valid_prefix = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !valid_prefix {
            return Err(format!(
                "invalid label key {key:?}: the prefix before \"/\" must be a DNS subdomain (lowercase letters, digits, \"-\" and \".\")"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("invalid label key {key:?}: the name part is empty"));
    }
    check_name(name).map_err(|why| format!("invalid label key {key:?}: {why}"))
}

/// A label value: empty, or at most 63 characters of the same shape as a key's name.
fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|why| format!("invalid label value {value:?}: {why}"))
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.len() > 63 {
        return Err("it must be at most 63 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("it may contain only letters, digits, \"-\", \"_\" and \".\"");
    }
    let first_last_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_last_ok(name.chars().next()) || !first_last_ok(name.chars().last()) {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

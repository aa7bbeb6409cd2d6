"""
Rewards, tasks and their environments for GRPO.

A reward is pure: (completion: str, answer: str) -> float, or a dict of named parts {name: float} (the reward is
their sum; each part is logged as reward_<name>, its mean over the rows that have it). `completion` is the last reply
(in a single-turn task, the completion). A function that also takes a parameter named `sample` gets the sequence's
row of the trainer's table: token ids ("prompt", "completion"), "sampled_tokens" (the tokens the model sampled),
"length" (every token after the prompt, an episode's environment messages too), "finish" ('stop'; 'length' when
--max_new_tokens cut it; 'turns' when the replies ran out), "messages" and "turns" (the whole episode), the server's
log-probs ("server_lp"), and in training the reference's ("ref_lp", when --beta > 0) -- e.g. a length penalty:
    def short(completion, answer, sample): return gsm8k_reward(completion, answer) - 0.001 * sample["sampled_tokens"]

Two registries:
  REWARD_FNS   what the trainer may train on (--reward NAME, or a weighted mix --reward gsm8k:1,format:0.1).
               Add yours there; shaped rewards are fine.
  TASKS        --task NAME: a task is its reward (what --reward auto trains on), its correctness check (what
               `accuracy` and the held-out `eval_accuracy` count, whatever the reward: shaping never inflates them),
               its instruction, its built-in rows (--dataset builtin) and, for episodes of several turns, its
               environment: (messages, answer) -> the next user message, or None (the episode ends); one that takes
               `warnings` too counts its own in that Counter (python_env: what its sandbox stopped or refused).

A task is held to a contract as its reward is, so that a student's first environment fails with a message, not a
traceback. At start the trainer checks the task it will run (check_task): a reward that names no REWARD_FNS entry, a
check that cannot be called as (completion, answer), an environment that cannot be called as (messages, answer) or
has max_turns 1 (its messages would never be sent) is one error naming the task and the fix. During the run an
environment that raises, or returns anything but a str or None, ends that episode with a counted warning (safe_env).
Rows whose answer no completion could match under the task's check ('' for exact, '2' for choice, '7.5' for guess)
are skipped at start and counted by why (answer_problem; a task's own rule is its check_answer). An answer given as a
JSON list of strings ('["Paris", "City of Light"]') is a list of aliases: exact and choice accept any of them.

extract_number(text)   the model's final numeric answer, normalized ("1,234" -> "1234", "$5" -> "5", "3.50" -> "3.5"):
                       the number after the LAST "####" wins; else the LAST \\boxed{...}; else the LAST number.
gsm8k, arithmetic      the final (GSM8K) or last (the built-in "What is 7 + 12?") number equals the answer's.
exact, choice          answers that are not numbers: the final line equals the answer, normalized (NFKC, case,
                       punctuation, a/an/the); or names its letter. A list answer: any of its aliases.
format                 1.0 for a line "#### <number>" or a "\\boxed{<number>}": a small shaping reward (weight ~0.1).
guess, calculator      the built-in tasks of episodes: guess the number ("higher"/"lower"), a calculator tool.
python                 a Python tool: a reply's code runs in a sandbox (run_python), its output is the next message.
safe_reward            a reward's bad value or exception -> 0.0 and a counted warning (one NaN would poison a group).
safe_env               an environment's exception or non-str message -> the episode ends, and a counted warning.
combine                --reward -> the trainer's reward: (sample, warnings) -> (reward, {part: value}).
check_task             a task's reward, check, environment, max_turns and example, at start -> one ValueError naming
                       the task.
episode                a task's worked example (Task.example) from its texts: question, reply, message, reply, ...
answer_problem         why no completion could match a row's answer under a task's check, or None.
task_weights, mix_rows several tasks in one run (--task arithmetic:2,calculator:1): the weights, and the rows mixed
                       by them, each row with its task's name.
"""
import inspect
import json
import math
import numbers
import random
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Callable
from decimal import Decimal, InvalidOperation

# One number: optional minus, optional "$", then either properly comma-grouped digits
# ("1,234,567") or plain digits, then an optional decimal part. A trailing "." with no
# digits after it ("42.") is left out, so sentence-ending periods are harmless.
# (?<!\d) stops the "-" in "10-3" being read as a negative sign.
_NUM = r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUM_RE = re.compile(r"(?<!\d)" + _NUM)
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")  # no nested braces: keeps the regex simple
_FORMAT_RE = re.compile(  # "#### 42" on its own line, or \boxed{42} / \boxed{\$42} anywhere
    r"^[ \t]*####[ \t]*" + _NUM + r"\.?[ \t]*$|\\boxed\{\s*\\?" + _NUM + r"\s*\}", re.MULTILINE)


def _normalize(num: str) -> str | None:
    """'$1,234.50' -> '1234.5'. Canonical strings, so equal numbers give equal strings."""
    try:
        d = Decimal(num.replace(",", "").replace("$", ""))
    except InvalidOperation:
        return None
    if not d.is_finite():  # 'NaN', 'Infinity': no completion's number is one
        return None
    if d == d.to_integral_value():
        return str(int(d))  # "72.00" -> "72", and "-0" -> "0"
    return format(d.normalize(), "f")  # "3.50" -> "3.5", and never "1E+1" style


def _last_number(text: str) -> str | None:
    nums = _NUM_RE.findall(text)
    return _normalize(nums[-1]) if nums else None


def extract_number(text: str) -> str | None:
    # "####" wins even if more numbers follow it: the model was told to put its answer
    # there, so anything after (a "check", a step count) is not the answer.
    if "####" in text:
        m = _NUM_RE.search(text.rsplit("####", 1)[1])  # FIRST number after the LAST ####
        if m:
            return _normalize(m.group())
    boxed = _BOXED_RE.findall(text)
    if boxed:
        num = _last_number(boxed[-1])  # "\$5" inside the box still parses: "$" is optional
        if num is not None:
            return num
    # Fallback: models usually end with the answer ("... so she has 18 apples.").
    return _last_number(text)


def gsm8k_correct(completion: str, answer: str) -> bool:
    pred, gold = extract_number(completion), extract_number(answer)
    # Normalized strings are canonical, so string equality is numeric equality.
    return pred is not None and pred == gold


def gsm8k_reward(completion: str, answer: str) -> float:
    return float(gsm8k_correct(completion, answer))


def format_reward(completion: str, answer: str | None = None) -> float:
    return 1.0 if _FORMAT_RE.search(completion) else 0.0  # answer unused: format only


def arithmetic_correct(completion: str, answer: str) -> bool:
    # Last number, not "any number": the question's own numbers ("7", "12") appear in most
    # completions, so "contains the answer" would be trivially hackable; the last number is
    # where a solution ends up ("7 + 12 = 19"). Deliberately strict: no ####/boxed logic.
    pred = _last_number(completion)
    return pred is not None and pred == _normalize(answer.strip())


def arithmetic_reward(completion: str, answer: str) -> float:
    return float(arithmetic_correct(completion, answer))


def number_problem(answer):
    """arithmetic's and calculator's answer check (see answer_problem): the answer must be a number itself ('19', not
    '#### 19'), since the check compares the completion's last number with the whole answer."""
    return None if _normalize(answer.strip()) is not None else "answer that is not a number"


# Answers that are not numbers: words (exact) or the letter of a choice (choice).
_LEAD_RE = re.compile(r"^(?:(?:so|thus|therefore)\s*,?\s*)?(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", re.I)
_LETTER_RE = re.compile(r"(?<![A-Za-z])\(?([A-J])\)?(?![A-Za-z])")  # capitals: 'a' is an article


def normalize_text(text: str) -> str:
    """'The  Eiffel-Tower.' -> 'eiffel tower': lower case, no punctuation, articles or extra spaces (SQuAD's way).
    NFKC first: an 'é' written as 'e' and a combining accent (decomposed, NFD) is the one-character 'é' a model writes.
    Punctuation is what Unicode calls so (categories P*, S*, Z*): a vowel sign of an Indic script (M*) is a letter's."""
    text = "".join(" " if unicodedata.category(c)[0] in "PSZ" else c for c in unicodedata.normalize("NFKC", text).lower())
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def final_line(completion: str) -> str:
    """The answer a completion gives: after its last '####' if it has one, else its last non-empty line, without a
    lead-in such as 'The answer is'."""
    text = completion.rsplit("####", 1)[1] if "####" in completion else completion
    lines = [line for line in text.strip().splitlines() if line.strip()] or [""]
    return _LEAD_RE.sub("", lines[-1].strip())


def aliases(answer: str) -> list[str] | None:
    """An answer that is a JSON list of strings ('["Paris", "City of Light"]': a dataset row's list, which the trainer
    passes as its JSON text) -> its strings, any of which is right (exact, choice); any other answer -> None: a plain
    answer, even one that starts with '[' ('[1, 2]', '[citation needed]')."""
    if not answer.lstrip().startswith("["):
        return None
    try:
        got = json.loads(answer)
    except ValueError:
        return None
    return got if isinstance(got, list) and all(isinstance(a, str) for a in got) else None


def exact_correct(completion: str, answer: str) -> bool:
    """The completion's final line (final_line) equals the answer once both are normalized: 'Paris.' for 'paris'; an
    answer that is a list (aliases) is matched by any of its strings."""
    names = aliases(answer)
    return any(_exact_match(completion, a) for a in ([answer] if names is None else names))


def _exact_match(completion, answer):
    return bool(normalize_text(answer)) and normalize_text(final_line(completion)) == normalize_text(answer)


def text_problem(answer):
    """exact's answer check (see answer_problem): some answer must be left once normalized ('the', '!!!': none is)."""
    names = aliases(answer)
    if names is None:
        return None if normalize_text(answer) else "answer empty once normalized (case, punctuation and a/an/the dropped)"
    if not names:
        return "answer an empty list of aliases"
    return None if any(map(normalize_text, names)) else "answer a list of aliases, each empty once normalized"


def exact_reward(completion: str, answer: str) -> float:
    return float(exact_correct(completion, answer))


def choice_correct(completion: str, answer: str) -> bool:
    """The letter the final line names (its last standalone capital A-J: 'B', '(B)', 'The answer is B.') is the
    answer's ('B', '(B)', 'b'), or one of a list's ('["B", "D"]')."""
    got, names = _LETTER_RE.findall(_nfkc(final_line(completion))), aliases(answer)  # NFKC: 'Ｂ' is 'B'
    for want in (_LETTER_RE.findall(_nfkc(a).strip().upper()) for a in ([answer] if names is None else names)):
        if got and want and got[-1].upper() == want[0].upper():
            return True
    return False


def _nfkc(text):
    return unicodedata.normalize("NFKC", text)


def letter_problem(answer):
    """choice's answer check (see answer_problem): the answer (or an alias) must name a letter A-J ('2' does not)."""
    names = aliases(answer)
    if any(_LETTER_RE.findall(_nfkc(a).strip().upper()) for a in ([answer] if names is None else names)):
        return None
    if names is None:
        return "answer that is not a letter A-J"
    return "answer a list of aliases, none a letter A-J" if names else "answer an empty list of aliases"


def choice_reward(completion: str, answer: str) -> float:
    return float(choice_correct(completion, answer))


def gsm8k_format_reward(completion: str, answer: str) -> float:
    """A shaped reward: correctness plus a small bonus for the '#### <number>' format (see format_reward)."""
    return gsm8k_reward(completion, answer) + 0.1 * format_reward(completion)


def safe_reward(fn, completion: str, answer: str, warnings, sample=None, name=None):
    """Call fn (with the sample if it takes one); anything other than a finite real number (or a dict of them; {}:
    no part applies, 0) becomes 0.0 and a counted warning, under `name` (the --reward term as written; else the
    function's). One NaN reward would turn the whole group's advantages into NaN."""
    name = name or getattr(fn, "__name__", repr(fn))
    try:
        r = fn(completion, answer, sample=sample) if wants_sample(fn) else fn(completion, answer)
        bad = [why for v in (r.values() if isinstance(r, dict) else [r]) if (why := not_a_number(v))]
        if not bad:
            return {k: float(v) for k, v in r.items()} if isinstance(r, dict) else float(r)
        reason = bad[0]
    except Exception as e:  # not BaseException: Ctrl-C should still stop training
        reason = f"raised {type(e).__name__}"
    key = f"{name}: {reason}"
    warnings[key] = warnings.get(key, 0) + 1
    return 0.0


def safe_env(env, messages, answer, warnings, name=None):
    """Call a task's environment (with the warnings, where it takes them): its next user message (a str) passes, None
    ends the episode. Anything else (it raised, or returned an int, a dict or '', an empty message) ends the episode
    with a counted warning, under `name` (else the function's), as safe_reward does for a reward: one bad reply of the
    model must not end the run with a traceback, and a dict's repr must not reach the model as a message."""
    name = name or getattr(env, "__name__", repr(env))
    try:
        said = env(messages, answer, warnings=warnings) if takes(env, "warnings") else env(messages, answer)
        if said is None or isinstance(said, str) and said.strip():
            return said
        reason = (f"returned {type(said).__name__} (a message must be a str, or None to end the episode)" if not
                  isinstance(said, str) else f"returned {said!r}, an empty message (the episode ends; return None to "
                  f"end it, or say something)")
    except Exception as e:  # not BaseException: Ctrl-C should still stop training
        reason = f"raised {type(e).__name__}" + (f": {shorten(str(e))}" if str(e).strip() else "")
    count_warning(warnings, f"{name}: {reason}")
    return None


def count_warning(warnings, key, n=1):
    """Count n warnings under key, "name: kind of failure: detail": one count per name and kind, under the first key
    seen (its detail, the reply that caused it), so that what a model writes cannot grow the log a key a reply."""
    kind = ":".join(key.split(":")[:2])
    key = next((k for k in warnings if k == kind or k.startswith(kind + ":")), key)
    warnings[key] = warnings.get(key, 0) + n


def merge_warnings(into, got):
    """Add a Counter of warnings (one thread's, say) into another, as count_warning counts them."""
    for key, n in got.items():
        count_warning(into, key, n)


def shorten(text, n=80):
    """One line of at most n characters: an error's message in a warning's key, or a value in an error."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def not_a_number(r):
    """-> why r is not a finite real number, or None. Bools are ints, so True -> 1.0 is fine (numpy's bools too)."""
    if r is None:
        return "returned None"
    if type(r).__module__ == "numpy" and type(r).__name__ in ("bool_", "bool"):  # numpy's bool is no numbers.Real
        return None
    if not isinstance(r, numbers.Real):
        return f"returned non-number {type(r).__name__}"
    if math.isnan(float(r)) or math.isinf(float(r)):
        return f"returned {'NaN' if math.isnan(float(r)) else 'inf'}"
    return None


def wants_sample(fn):
    return takes(fn, "sample")


def takes(fn, name):
    """fn has a parameter `name`: a reward's sample, an environment's warnings (a Counter of why: what its tool
    stopped or refused)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def cannot_call(fn, role, *args, **kwargs):
    """-> why fn cannot be called with these arguments ("f(x) cannot be called as a check (too many positional
    arguments)"), or None: it can, or it has no signature to read (a builtin: it says so when called)."""
    if not callable(fn):
        return f"{shorten(repr(fn))} (a {type(fn).__name__}) cannot be called as {role}"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        return f"{getattr(fn, '__name__', fn)}{sig} cannot be called as {role} ({e})"
    return None


def check_signature(name, fn):
    """A reward must take (completion, answer), or (completion, answer, sample): else one error at start, not a run
    that trains on zeros with a warning a step."""
    why = cannot_call(fn, "a reward", "completion", "answer", **({"sample": {}} if wants_sample(fn) else {}))
    if why:
        raise ValueError(f"{name!r}: {why}: it must take (completion, answer), or (completion, answer, sample) to see "
                         f"the sequence")


def combine(spec, task, taken=()):
    """--reward -> fn(sample, warnings) -> (reward, {part: value}). spec: 'auto' (the task's reward), a name in
    REWARD_FNS, or a weighted mix 'name:weight,name:weight' (TRL's reward_funcs + reward_weights): the reward is the
    weighted sum, and each function's value is logged unweighted as a part (a dict's entries, each as its own).
    taken: names a part may not have (the trainer logs reward_<part>, and has terms of its own): a term so named is an
    error, a dict's entry so named is logged as <term>.<entry>, as is one named like another term of the mix."""
    terms = reward_terms(spec, task)
    clash = [n for n, _, _ in terms if n in taken and len(terms) > 1]
    if clash:
        raise ValueError(f"{clash[0]!r}: its part would be logged as reward_{clash[0]}, which the trainer logs itself "
                         f"(reward_{', reward_'.join(taken)}): register the reward under another name")
    if not any(w for _, _, w in terms):  # every reward 0: every advantage 0, a run that trains on nothing
        raise ValueError(f"{spec!r}: every weight is 0, so every reward would be 0: give at least one term a weight "
                         f"other than 0 (e.g. gsm8k:1,format:0.1)")

    # a warning names the term as written (for auto, the task's own reward) and the task: "arithmetic (--task
    # arithmetic): raised ZeroDivisionError"
    label = {name: f"{TASKS[task].reward if name == 'auto' else name} (--task {task})" if task in TASKS else name
             for name, _, _ in terms}

    # a dict's entry named like a name taken, or like another term (whose part it would overwrite): <term>.<entry>
    kept = {name: set(taken) | ({n for n, _, _ in terms if n != name} if len(terms) > 1 else set())
            for name, _, _ in terms}

    def reward(sample, warnings):
        total, parts = 0.0, {}
        for name, fn, weight in terms:
            r = safe_reward(fn, sample["text"], sample["answer"], warnings, sample, label[name])
            if isinstance(r, dict):
                parts.update({f"{name}.{k}" if k in kept[name] else k: v for k, v in r.items()})
                r = sum(r.values())
            elif len(terms) > 1:
                parts[name] = r
            total += weight * r
        return total, parts
    return reward


def reward_terms(spec, task=None):
    """A --reward spec -> [(name, fn, weight)]: each name registered, each weight finite, each signature a reward's.
    'auto' is the task's own reward (none without a task): a name, or a mix whose weights auto's weight scales (auto:2
    of a task's 'a:1,b:0.1' is a:2,b:0.2)."""
    terms = []
    for item in spec.split(","):
        name, _, weight = item.strip().partition(":")
        try:
            terms.append((name, None if name == "auto" and task else get_reward_fn(name), float(weight or 1)))
            if not math.isfinite(terms[-1][2]):  # a NaN weight makes every reward NaN, then NaN gradients
                raise ValueError
        except ValueError as e:
            raise ValueError(str(e) if "unknown" in str(e) else f"{item!r}: the weight must be a finite number "
                             f"(e.g. gsm8k:1,format:0.1)") from None
        if terms[-1][1] is None:  # auto: the task's terms, weighted; one term keeps the name 'auto' (its part's)
            own, w = reward_terms(TASKS[task].reward), terms.pop()[2]
            terms += [("auto" if len(own) == 1 else n, fn, w * v) for n, fn, v in own]
            continue
        check_signature(name, terms[-1][1])
    return terms


REWARD_FNS = {"gsm8k": gsm8k_reward, "arithmetic": arithmetic_reward, "format": format_reward,
              "gsm8k_format": gsm8k_format_reward, "exact": exact_reward, "choice": choice_reward}


def get_reward_fn(name: str):
    if name not in REWARD_FNS:
        raise ValueError(f"unknown reward function {name!r}; valid names: {', '.join(sorted(REWARD_FNS))}")
    return REWARD_FNS[name]


# ---- Tasks and their environments. A task is its prompt rows (a dataset, or built in), its reward, its check (what
# accuracy counts) and, for episodes of several turns, its environment: a function of the conversation so far that
# answers the model's reply with the next user message (a game's feedback, a tool's result), or None: the episode
# ends. --task NAME picks one (several: --task a,b, at the end of this file); add yours to TASKS.

@dataclass
class Task:
    """A task, TASKS[NAME] (--task NAME). The trainer checks it at start (check_task): a reward that is no name of
    REWARD_FNS, a check or an environment that cannot be called as below, an environment with max_turns 1 (its
    messages would never be sent) -- each is one error that names the task, not a traceback mid-run or a blamed flag.
    The environment runs on whatever the model replies: a str is the next user message, None ends the episode; when it
    raises or returns anything else, that episode ends with a counted warning (safe_env), and the run goes on.
    Rows whose answer no completion could match are skipped at start, counted by why (answer_problem): check_answer
    says why, or None; a task without one needs a number in each answer when numeric, and takes any answer when not.
    An answer may be a JSON list of strings, its aliases: exact and choice accept any of them.
    An example is one episode, worked, that the trainer puts before each question (--example: in plain prompts by
    default, where a base model learns the protocol from it): the messages of an episode as the environment sees them,
    [{"role": "user", "content": a question}, {"role": "assistant", "content": a reply}, {"role": "user", "content":
    the environment's message for it}, ..., {"role": "assistant", "content": the last reply}], its question with the
    instruction appended as any question's. Write each reply on one line (plain prompts end a reply at a newline)."""
    reward: str                      # what --reward auto trains on: a REWARD_FNS name or a mix ("guess:1,format:0.1")
    correct: Callable                # (completion, answer) -> bool, on the episode's last reply: what accuracy counts
    instruction: str = ""            # appended to each question
    env: Callable | None = None      # (messages, answer[, warnings]) -> the next user message, or None: it is done
    max_turns: int = 1               # the model's replies per episode at most (--max_turns 0 takes this)
    rows: Callable | None = None     # () -> the built-in rows [{"question", "answer"}] (--dataset builtin)
    numeric: bool = True             # its answers hold a number (rows without one are skipped)
    check_answer: Callable[[str], str | None] | None = None  # (answer) -> why no completion can match it, or None
    example: list[dict] | None = None  # one episode, worked, shown before each question (--example): its messages


def answer_problem(task, answer):
    """-> why no completion could ever match this row's answer under the task's check (the trainer skips the row and
    counts it under this reason), or None: it can be matched. The task's check_answer when it has one (a rule that
    raises or returns no str says so, as the reason); else a numeric task's answer must hold a number."""
    rule = task.check_answer
    if rule is None:
        return "answer without a number" if task.numeric and extract_number(answer) is None else None
    name = getattr(rule, "__name__", repr(rule))
    try:
        why = rule(answer)
    except Exception as e:
        return f"{name} raised {type(e).__name__}" + (f": {shorten(str(e))}" if str(e).strip() else "")
    return why if why is None or isinstance(why, str) else f"{name} returned {type(why).__name__} (why, a str, or None)"


def episode(*texts):
    """A worked example (Task.example) from its texts: the question, a reply, the environment's message, a reply, ..."""
    return [{"role": "assistant" if k % 2 else "user", "content": t} for k, t in enumerate(texts)]


def check_task(name, task):
    """The task the trainer will run, checked at start: each mistake is one ValueError that names the task and says the
    fix, where it would have been a traceback from the rollout, a warning every step while accuracy stays 0, an error
    that blames --reward (a flag the user never gave), or an environment whose messages are silently dropped."""
    where = f"--task {name} (TASKS[{name!r}] in reward_fns.py)"
    if not isinstance(task.reward, str):  # a function given for its name: the trainer looks names up
        fn = getattr(task.reward, "__name__", "")
        what = f"the function {fn}" if callable(task.reward) else shorten(repr(task.reward))
        fn = fn if fn.isidentifier() else "my_reward"
        raise ValueError(f"{where}: its reward must be the name of a reward in REWARD_FNS (or a mix of them, e.g. "
                         f"'gsm8k:1,format:0.1'), not {what}: register the function, REWARD_FNS[{fn!r}] = {fn}, "
                         f"and give the task its name, Task({fn!r}, ...)")
    try:
        combine(task.reward, None)  # its names, weights and signatures, as --reward's
    except ValueError as e:
        raise ValueError(f"{where}: its reward {task.reward!r} must name rewards of REWARD_FNS (a name, or a mix such "
                         f"as 'gsm8k:1,format:0.1'): {e}") from None
    calls = [("correct", "a check", ("completion", "answer"),
              "take (completion, answer) and return whether the completion is right (True or False)"),
             ("env", "an environment", ([], "answer"),
              "take (messages, answer) (and warnings, a Counter of its own warnings, if it wants them) and return the "
              "next user message (a str), or None to end the episode"),
             ("check_answer", "an answer check", ("answer",),
              "take (answer) and return why no completion can match it (a str), or None")]
    for field, role, args, must in calls:
        fn = getattr(task, field)
        if fn is None and field != "correct":  # env and check_answer are optional
            continue
        why = cannot_call(fn, role, *args, **({"warnings": {}} if field == "env" and takes(fn, "warnings") else {}))
        if why:
            raise ValueError(f"{where}: its {field}, {why}: it must {must}")
    turns, env = task.max_turns, getattr(task.env, "__name__", "env")
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"{where}: its max_turns is {turns!r}: it must be a whole number of replies, at least 1 "
                         f"(1 for a task without an environment)")
    if task.env is not None and turns == 1:
        raise ValueError(f"{where}: it has an environment ({env}) but max_turns 1, so every episode ends at the first "
                         f"reply and the environment's messages would be thrown away: set max_turns to the most "
                         f"replies an episode may take, e.g. Task(..., env={env}, max_turns=3)")
    if task.env is None and turns > 1:
        raise ValueError(f"{where}: its max_turns is {turns} but it has no environment to answer a reply, so every "
                         f"episode is one turn: give it an env (messages, answer) -> the next user message, or drop "
                         f"max_turns")
    if task.example is not None:
        check_example(where, task.example, turns)


def check_example(where, example, turns):
    """A task's worked example: an episode's messages, the user's and the assistant's in turn from the question to the
    last reply, each a str that is not blank, at most max_turns replies; else one ValueError naming the task and the
    fix."""
    fix = ("write it as an episode's messages, the user's and the assistant's in turn from the question to the last "
           "reply: [{'role': 'user', 'content': 'What is 2 * 3?'}, {'role': 'assistant', 'content': 'calc: 2 * 3'}, "
           "{'role': 'user', 'content': '6'}, {'role': 'assistant', 'content': '2 * 3 = 6'}]")
    if not isinstance(example, list) or not example:
        raise ValueError(f"{where}: its example is {shorten(repr(example))}, no episode: {fix}")
    for k, m in enumerate(example):
        role = "user" if k % 2 == 0 else "assistant"
        if not (isinstance(m, dict) and m.get("role") == role and isinstance(m.get("content"), str)
                and m["content"].strip()):
            raise ValueError(f"{where}: its example's message {k} is {shorten(repr(m))}, where the {role}'s belongs "
                             f"({{'role': {role!r}, 'content': a text that is not blank}}): {fix}")
    if len(example) % 2:
        raise ValueError(f"{where}: its example ends with the user's message {shorten(repr(example[-1]['content']))}, "
                         f"and an episode ends with the model's last reply (the assistant's): {fix}")
    if len(example) // 2 > turns:
        raise ValueError(f"{where}: its example has {len(example) // 2} replies, and its episodes at most max_turns="
                         f"{turns}: show an episode that fits, or raise max_turns")


def arithmetic_rows(max_operand=20, seed=1234):
    """'What is a + b?' for all a, b in 0..max_operand, shuffled: SmolLM2-135M starts at ~35% greedy."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs]


# Guess the number (Tinker's "simplest example" of a multi-turn task): after each guess the environment says whether
# the secret is higher or lower. Binary search finds any of 1..GUESS_MAX within GUESS_TURNS guesses; guessing blind,
# about GUESS_TURNS / GUESS_MAX of the games are won.
GUESS_MAX, GUESS_TURNS = 16, 5


def guess_rows(seed=1234, copies=20):
    """Each secret of 1..GUESS_MAX `copies` times, shuffled; the question is the same for all (the secret is hidden)."""
    secrets = [n for n in range(1, GUESS_MAX + 1) for _ in range(copies)]
    random.Random(seed).shuffle(secrets)
    return [{"question": GUESS_QUESTION, "answer": str(n)} for n in secrets]


GUESS_QUESTION = (f"Let's play a game. I am thinking of a number between 1 and {GUESS_MAX}. Guess it! Reply with just "
                  f"a number. After each guess I will tell you whether my number is higher or lower.")


def first_integer(text):
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m else None


def secret_problem(answer):
    """guess's answer check (see answer_problem): the secret must be a whole number from 1 to GUESS_MAX."""
    try:
        ok = 1 <= int(answer) <= GUESS_MAX
    except (TypeError, ValueError):  # '7.5', 'five'
        ok = False
    return None if ok else f"answer that is not a whole number from 1 to {GUESS_MAX}"


def guess_secret(answer):
    """The row's secret, or a ValueError that says what is wrong with it (a traceback would say 'invalid literal for
    int()'). answer_problem keeps such rows out of training; safe_env counts the error if one gets this far."""
    if secret_problem(answer):
        raise ValueError(f"the answer {answer!r} is not a whole number from 1 to {GUESS_MAX}, so no guess can find it")
    return int(answer)


def guess_env(messages, answer):
    """The reply's guess (its first integer) -> "higher" or "lower" than it, or None: found, the game ends."""
    guess, secret = first_integer(messages[-1]["content"]), guess_secret(answer)
    if guess == secret:
        return None
    if guess is None:
        return f"That is not a number. Guess a number from 1 to {GUESS_MAX}."
    return f"My number is {'higher' if secret > guess else 'lower'} than {guess}. Guess again."


def guess_correct(completion, answer):
    """The last reply found the secret (the game ends at the right guess)."""
    return first_integer(completion) == guess_secret(answer)


def guess_reward(completion, answer, sample):
    """1 for a game won; else 0.1 x the share of replies whose guess (its first integer) was still possible given what
    the environment had said (in 1..GUESS_MAX, above each number it called too low, below each one too high): partial
    credit for playing by the rules and using the feedback, which a small model must learn first."""
    if guess_correct(completion, answer):
        return 1.0
    lo, hi, secret, fair = 1, GUESS_MAX, guess_secret(answer), []
    for guess in (first_integer(m["content"]) for m in sample["messages"] if m["role"] == "assistant"):
        fair.append(guess is not None and lo <= guess <= hi)
        if guess is not None:  # the environment's answer narrows the range
            lo, hi = (max(lo, guess + 1), hi) if secret > guess else (lo, min(hi, guess - 1))
    return 0.1 * sum(fair) / len(fair)


# A calculator tool (nanochat's demo): products the model cannot do in its head. A reply "calc: <expression>" gets
# the expression's value as the next user message; any other reply is the answer and ends the episode.
def calculator_rows(n=20000, seed=1234):
    """'What is a * b?' for n distinct pairs, a of 3 digits, b of 2."""
    pairs = [(100 + k // 90, 10 + k % 90) for k in random.Random(seed).sample(range(900 * 90), n)]
    return [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in pairs]


_CALL_RE = re.compile(r"calc:\s*([-+*/()×xX \d.]+)", re.IGNORECASE)  # (× and x: times, as models write it)
CALC_MAX_CHARS = 200  # an expression longer than this is "error": the task's products need ~20 characters


def calculate(expr):
    """An arithmetic expression (numbers, + - * / and brackets) -> its value as text, or "error" when it has none:
    never an exception, whatever the model wrote (one reply of 6,000 minus signs made ast.parse raise MemoryError)."""
    import ast
    if len(expr) > CALC_MAX_CHARS:  # deep nesting exhausts the parser's memory and the evaluator's recursion
        return "error"
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b}

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = ev(node.left), ev(node.right)
            if max(abs(a), abs(b)) > 1e12:
                raise ValueError("too large")
            return ops[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("not arithmetic")
    try:
        v = ev(ast.parse(re.sub(r"[×xX]", "*", expr).strip(), mode="eval").body)
        return str(int(v)) if float(v).is_integer() else f"{v:.6g}"
    except (SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError):  # ArithmeticError: 1 / 0, or a
        return "error"                                                               # number too large for a float


def calculator_env(messages, answer):
    """A reply that calls the calculator ("calc: 123 * 45") -> the value ("5535"); any other reply ends the episode."""
    call = _CALL_RE.search(messages[-1]["content"])
    return calculate(call.group(1)) if call else None


def calculator_correct(completion, answer):
    """The answer (the last reply, not a call) holds the product as its last number."""
    return not _CALL_RE.search(completion) and arithmetic_correct(completion, answer)


def calculator_reward(completion, answer, sample):
    """1 for the right product; else 0.1 for having called the calculator: partial credit for using the tool, which
    the model rarely does at first and without which it cannot get these products right."""
    if calculator_correct(completion, answer):
        return 1.0
    called = any(_CALL_RE.search(m["content"]) for m in sample["messages"] if m["role"] == "assistant")
    return 0.1 * (called and not _CALL_RE.search(completion))  # called, then answered: never for calls alone


# A Python tool: the model answers a word problem and may run code first. A reply with a ```python block (or, where
# plain prompts end a reply at a newline, a line "python: <code>") gets what the code printed, or the value of its
# last expression, or one line of error, as the next user message; a reply without code is the answer and ends the
# episode. The code runs in a sandbox (run_python): a separate interpreter, limited and watched.
PY_LIMITS = {"cpu_s": 2, "wall_s": 10, "memory_mb": 512, "output_chars": 1000, "file_mb": 1}
# The modules a snippet may import: loaded before the limits apply, any other import is refused. To add one, name it
# here (a module of the standard library; a package such as numpy also needs the interpreter's site-packages: drop
# "-S" in run_python, and its threads need RLIMIT_NPROC raised). Never add one that reaches the network, starts
# processes or loads C code at will: socket, subprocess, multiprocessing, ctypes, os's process calls. (unicodedata:
# Python imports it itself to read a name that is not ASCII, such as `总数 = 12`, or a "\N{...}" escape.)
PY_MODULES = ("math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "collections", "heapq",
              "bisect", "datetime", "re", "string", "json", "operator", "random", "unicodedata")
PY_MAX_CODE = 4000  # characters of code at most: a longer snippet is refused without running


def run_python(code, limits=None, modules=None):
    """Run a snippet in the sandbox -> (the text the model sees, None or why the sandbox stopped or refused it). The
    text is what it printed, then the value of its last expression (as a REPL shows it), or one line of error; at
    most limits["output_chars"] characters. The sandbox is a new interpreter (no site-packages, no environment
    variables but a fixed hash seed, `random` seeded) with limits on CPU time, memory, file size and open files, no
    child processes (RLIMIT_NPROC 0), and an audit hook that refuses imports outside `modules`, sockets, processes,
    signals, and writes or deletions outside its folder (deleted afterwards). Started as root (which ignores
    RLIMIT_NPROC and may write anywhere), it is also jailed in that folder (chroot) as the user nobody. The parent
    stops it at limits["wall_s"] seconds. limits and modules: PY_LIMITS and PY_MODULES unless given."""
    import os, signal, shutil, subprocess, sys, tempfile
    limits, modules = limits or PY_LIMITS, modules or PY_MODULES  # (read now: a student may change them)
    if len(code) > PY_MAX_CODE:
        return f"Error: the code is over {PY_MAX_CODE} characters", f"code over {PY_MAX_CODE} characters"
    scratch = tempfile.mkdtemp(prefix="grpo_python_")
    work = os.path.join(scratch, "work")  # the snippet's folder
    os.mkdir(work)
    if os.getuid() == 0:
        os.chown(work, 65534, 65534)  # it runs as nobody: this is where it may write
    settings = json.dumps({**limits, "modules": list(modules)})
    out = tempfile.TemporaryFile()  # a file, not a pipe: RLIMIT_FSIZE bounds what the snippet can write to it
    try:
        # -s -S: no site-packages; -P: not the folder on sys.path; env: ours alone, a fixed hash seed (the same
        # code prints the same set in every run, and a resumed run is the one that never stopped)
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # (Python 3.10 has no -P)
        p = subprocess.Popen([sys.executable, "-s", "-S", "-B", *safe_path, "-c", _SANDBOX, scratch, settings, code],
                             cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                             env={"LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"})
        try:
            p.wait(timeout=(wall := limits["wall_s"]))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return "Error: the code ran too long and was stopped", f"stopped at the wall-time limit ({wall} s)"
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - (limits["output_chars"] + 200) * 8))  # its last line, at most this long
        last = out.read().decode("utf-8", "replace").splitlines()[-1:]
    finally:
        out.close()
        shutil.rmtree(scratch, ignore_errors=True)
    cpu, mb = limits["cpu_s"], limits["file_mb"]
    try:
        got = json.loads(last[0])  # the sandbox's last line: {"text", "why"}
        memory = f" ({limits['memory_mb']} MB)" if got["why"] == "over the memory limit" else ""
        return got["text"] or "(no output)", got["why"] and got["why"] + memory
    except (IndexError, ValueError, KeyError, TypeError):
        pass
    if p.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "Error: the code used too much CPU time and was stopped", f"stopped at the CPU-time limit ({cpu} s)"
    if size >= limits["file_mb"] * 2**20:
        return "Error: the code wrote too much and was stopped", f"output over the file-size limit ({mb} MB)"
    return f"Error: the code crashed (exit {p.returncode})", f"crashed (exit {p.returncode})"


# The sandbox's own code, run as `python -s -S -B -P -c _SANDBOX scratch settings code`: trusted until it calls exec.
_SANDBOX = r"""
import ast, json, os, posix, resource, sys
scratch, lim, code = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sys.argv = ["<code>"]
for m in lim["modules"]:
    __import__(m)  # before the hook and the user change: the interpreter's files may be unreadable to nobody
if "random" in sys.modules:
    sys.modules["random"].seed(0)  # a snippet's draws are the same in every run
for name in ("mkfifo", "mknod"):  # they make files and raise no audit event
    for mod in (os, posix):
        hasattr(mod, name) and delattr(mod, name)
mb = 2 ** 20
for what, n in ((resource.RLIMIT_AS, lim["memory_mb"] * mb), (resource.RLIMIT_FSIZE, lim["file_mb"] * mb),
                (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 32)):
    resource.setrlimit(what, (n, n))
resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))  # SIGXCPU, then SIGKILL a second later
top = os.path.realpath(scratch) + "/work"  # the snippet's folder, where it may write
if os.getuid() == 0:  # root ignores RLIMIT_NPROC and may write anywhere: jail the snippet in scratch, as nobody
    try:
        os.chroot(scratch); top = "/work"; os.chdir(top)
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
    except OSError:
        pass  # (not allowed here: the audit hook below still refuses processes and writes)
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


class Refused(BaseException):  # not an Exception: `except Exception` in the snippet does not swallow it by accident
    pass


class OutputCap(BaseException):
    pass


def make_hook(top, allowed):
    # Its state is immutable (a str, frozensets, tuples): the snippet can reach the hook's frame through a refusal's
    # traceback, and nothing there may switch it off.
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    paths = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                       "os.chmod", "os.chown", "os.utime", "os.chdir", "os.setxattr", "os.removexattr"})
    never = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
             "subprocess.", "socket.", "ctypes.", "_thread.", "signal.", "resource.setrlimit", "sys.addaudithook",
             "os.putenv", "mmap.", "sys.setrecursionlimit")
    realpath, fsdecode = os.path.realpath, os.fsdecode
    inside = lambda p: isinstance(p, int) or realpath(fsdecode(p)).startswith(top + "/")

    def hook(event, args):
        # Refused(the warning's words, the model's): the first names a kind of thing, never what the model wrote
        if event == "import" and args[0].partition(".")[0] not in allowed:
            raise Refused(f"import {args[0].partition('.')[0]}", f"import {args[0]}")
        if event.startswith(never):
            raise Refused(event, event)
        if event == "open" and args[2] & writes and not inside(args[0]):
            raise Refused("a write outside its folder", f"writing {args[0]} outside this folder")
        if event in paths and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise Refused(f"{event} outside its folder", f"{event} outside this folder")
        if event == "object.__setattr__" and args[1] in ("__code__", "__globals__", "__closure__"):
            raise Refused(f"setting {args[1]}", f"setting {args[1]}")
    return hook


class Out:  # print()'s stream: what the model will see, stopped past the cap
    def __init__(self, cap):
        self.text, self.cap = "", cap

    def write(self, s):
        self.text += s
        if len(self.text) > self.cap:
            raise OutputCap
        return len(s)

    def flush(self):
        pass


cap, why, end = lim["output_chars"], None, ""
out = Out(cap)
real, sys.stdout, sys.stderr = sys.stdout, out, out
sys.addaudithook(make_hook(top, frozenset(lim["modules"] + ["encodings"])))
del make_hook, lim
try:
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    scope = {"__name__": "__main__"}
    exec(compile(tree, "<code>", "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
        if value is not None:
            print(repr(value))
except Refused as e:
    why, end = f"refused {e.args[0]}", f"Error: not allowed here: {e.args[1]}"
except OutputCap:
    why, end = f"output over {cap} characters", f"(output cut at {cap} characters)"
    out.text = out.text[:cap]
except MemoryError:
    why, end = "over the memory limit", "MemoryError: the code needs more memory than it may use"
except BaseException as e:
    line = next((s for s in str(e).splitlines() if s.strip()), "")
    end = f"{type(e).__name__}: {line}" if line else type(e).__name__
text = (out.text.rstrip("\n") + "\n" + end).strip() if end else out.text.strip()
real.write("\n" + json.dumps({"text": text[: cap + 80], "why": why}) + "\n")
real.flush()
"""

_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)  # an unclosed one: cut short
_PY_LINE_RE = re.compile(r"^[ \t]*python:[ \t]*(\S.*)$", re.M | re.I)


def python_code(reply):
    """The code a reply asks to run: its fenced blocks (```python ... ```), joined; else its "python: <code>" lines;
    else None (a reply without code is the answer)."""
    blocks = [b for b in _FENCE_RE.findall(reply) if b.strip()]
    lines = _PY_LINE_RE.findall(reply)
    return "\n".join(blocks) if blocks else "\n".join(lines) if lines else None


def python_env(messages, answer, warnings=None):
    """A reply with code -> what running it gave, as the next user message; a reply without code -> None: the episode
    ends. A snippet stopped or refused by the sandbox is counted in `warnings`, under its cause."""
    code = python_code(messages[-1]["content"])
    if code is None:
        return None
    text, why = run_python(code)
    if why and warnings is not None:
        count_warning(warnings, f"python_env: {why}")
    return text


def python_correct(completion, answer):
    """The last reply has no code and its final number (after '####', in \\boxed{}, else its last) is the answer."""
    return python_code(completion) is None and gsm8k_correct(completion, answer)


def python_reward(completion, answer):
    return float(python_correct(completion, answer))


def word_problem_rows(n=1000, seed=1234):
    """n multi-step word problems with whole-number answers, from templates and a fixed seed (GSM8K's form, not its
    text): a few products and sums of 2- and 3-digit numbers, the kind a small model gets wrong in its head."""
    rng, rows = random.Random(seed), []
    while len(rows) < n:
        r = lambda lo, hi: rng.randint(lo, hi)
        k = rng.randrange(len(_WORD_PROBLEMS))
        q, a = _WORD_PROBLEMS[k](r)
        if a > 0 and {"question": q, "answer": str(a)} not in rows[-50:]:
            rows.append({"question": q, "answer": str(a)})
    return rows


def _bakery(r):
    a, b, c = r(12, 48), r(24, 96), r(3, 9)
    d = r(100, a * b * c - 1)
    return (f"A bakery bakes {a} trays of {b} muffins each day. After {c} days it has sold {d} muffins. How many "
            f"muffins are left?", a * b * c - d)


def _pencils(r):
    c, q, b = r(6, 24), r(11, 60), r(12, 36)
    return (f"A school orders pencils in boxes of {b}. It orders enough boxes to give each of its {c} classes {q} "
            f"boxes, then hands out {r(2, 9) * 10} pencils to teachers. How many pencils do the classes get in all?",
            c * q * b)


def _savings(r):
    a, b, c, d = r(12, 45), r(20, 48), r(150, 600), r(4, 26)
    return (f"Maria earns ${a} an hour and works {b} hours a week. She spends ${c} a week on rent and food. How much "
            f"does she save in {d} weeks?", (a * b - c) * d)


def _train(r):
    a, b, c, d = r(45, 180), r(2, 9), r(40, 160), r(2, 9)
    return (f"A train travels at {a} km per hour for {b} hours, then at {c} km per hour for {d} hours. How many "
            f"kilometers does it travel in all?", a * b + c * d)


def _orchard(r):
    a, b, c, d = r(8, 40), r(12, 60), r(35, 180), r(6, 25)
    return (f"A farmer has {a} rows of apple trees with {b} trees in each row. Each tree gives {c} apples. He packs "
            f"the apples in bags of {d}. How many bags can he fill completely?", a * b * c // d)


def _shop(r):
    a, b, c = r(40, 400), r(7, 35), r(3, 30)
    d = r(2, a // 4)
    return (f"A shop buys {a} shirts for ${b} each and sells them for ${b + c} each. It sells all but {d} of them. "
            f"How much profit does it make?", (a - d) * (b + c) - a * b)


def _library(r):
    a, b, c, d = r(1200, 9800), r(12, 80), r(15, 64), r(50, 900)
    return (f"A library has {a} books. It buys {b} boxes of {c} books each and gives away {d} old books. How many "
            f"books does it have now?", a + b * c - d)


def _tank(r):
    c, k, t = r(3, 20), r(4, 30), r(12, 90)
    return (f"A tank holds {k * t} liters. Water flows in at {c + k} liters a minute and leaks out at {c} liters a "
            f"minute. How many minutes does it take to fill the empty tank?", t)


def _buses(r):
    a, b, c = r(150, 990), r(28, 64), r(5, 40)
    return (f"{a} students and {c} teachers go on a trip. Each bus carries {b} people. How many buses do they need?",
            -(-(a + c) // b))


def _recipe(r):
    b, k, c = r(6, 30), r(3, 17), r(2, 40)
    return (f"A recipe uses {b * k} grams of flour for {b} cookies. How many grams of flour are needed for {b * c} "
            f"cookies?", b * k * c)


_WORD_PROBLEMS = (_bakery, _pencils, _savings, _train, _orchard, _shop, _library, _tank, _buses, _recipe)
PYTHON_QUESTION = "A shop sells 124 boxes of 36 pens each, then gives away 250 pens. How many pens does it have left?"

REWARD_FNS.update(guess=guess_reward, calculator=calculator_reward, python=python_reward)
TASKS = {
    "arithmetic": Task("arithmetic", arithmetic_correct, "Answer with the number only.", rows=arithmetic_rows,
                       check_answer=number_problem),
    "gsm8k": Task("gsm8k", gsm8k_correct, "Solve the problem step by step, then give the final answer on its own line "
                                          "as '#### <number>'."),
    "exact": Task("exact", exact_correct, "Answer with the answer only.", numeric=False, check_answer=text_problem),
    "choice": Task("choice", choice_correct, "Answer with the letter of the right choice only.", numeric=False,
                   check_answer=letter_problem),
    "guess": Task("guess", guess_correct, env=guess_env, max_turns=GUESS_TURNS, rows=guess_rows,
                  check_answer=secret_problem,  # the example's secret is 11: binary search finds it
                  example=episode(GUESS_QUESTION, "8", "My number is higher than 8. Guess again.", "12",
                                  "My number is lower than 12. Guess again.", "10",
                                  "My number is higher than 10. Guess again.", "11")),
    "calculator": Task("calculator", calculator_correct, "To use a calculator, reply with calc: followed by the "
                       "expression (for example calc: 12 * 34) and I will tell you the result.",
                       env=calculator_env, max_turns=3, rows=calculator_rows, check_answer=number_problem,
                       example=episode("What is 347 * 29?", "calc: 347 * 29", "10063", "347 * 29 = 10063")),
    "python": Task("python", python_correct, "You can run Python: reply with a ```python block (or, on one line, "
                   "python: <code>) and I will tell you what it prints. When you know the answer, reply without code "
                   "and end with 'Answer: <number>'.", env=python_env, max_turns=3, rows=word_problem_rows,
                   check_answer=number_problem,
                   example=episode(PYTHON_QUESTION, "python: print(124 * 36 - 250)", "4214", "Answer: 4214")),
}


# ---- Several tasks in one run: --task arithmetic:2,calculator:1. Each prompt row carries its task's name ("task"), and
# the trainer takes the row's reward, check, environment, turns and stop strings from that task. A group is one row's
# episodes, so it never mixes tasks. A local JSON/JSONL row names its task in a "task" field.

def task_weights(spec):
    """--task 'a:2,b:1' -> {name: weight}, in the order written; a name without a weight weighs 1. ValueError for an
    empty name, a name given twice, or a weight that is not a positive finite number. (The trainer checks the names
    against TASKS: a student may add a task after this module loads.)"""
    weights = {}
    for item in spec.split(","):
        name, colon, w = (s.strip() for s in item.partition(":"))
        if not name:
            raise ValueError(f"{spec!r} has an empty task name: write names separated by commas, each with an optional "
                             f"weight (arithmetic:2,calculator:1)")
        if name in weights:
            raise ValueError(f"{spec!r} names {name!r} twice: give each task once, with its weight")
        try:
            weight = float(w) if colon else 1.0
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"{spec!r}: {name}'s weight {w!r} is not a positive number: a weight is the task's share "
                             f"of the prompts (arithmetic:2,calculator:1 draws two arithmetic prompts for each "
                             f"calculator prompt)")
        weights[name] = weight
    return weights


def mix_rows(rows, weights, seed=1234):
    """{task: its rows} -> one list of rows, each with its task's name in "task". Each task's share of the list is its
    share of the weights (1 each: equal shares) of as many rows as all tasks have together, its rows shuffled and
    repeated as often as that needs (a small task's rows come back more often than a large one's); a task whose share
    is less than one row gets one."""
    total, out, top = sum(len(r) for r in rows.values()), [], max(weights.values())
    share = {name: w / top for name, w in weights.items()}  # <= 1 each: a sum of weights near 1e308 would overflow
    for name, task_rows in rows.items():
        n = max(1, round(total * share[name] / sum(share.values())))  # at least one row, however small its share
        order = list(range(len(task_rows)))
        random.Random(f"{seed}:{name}").shuffle(order)
        out += [{**task_rows[order[i % len(order)]], "task": name} for i in range(n)]
    return out

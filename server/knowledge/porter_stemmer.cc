// The Porter stemming algorithm (M.F. Porter, 1980), steps 1a-5b.
#include <string>

#include "server/knowledge/tokenizer.h"

namespace fwai {
namespace {

class Stemmer {
 public:
  explicit Stemmer(std::string w) : b_(std::move(w)) {}

  std::string Run() {
    if (b_.size() <= 2) return b_;
    k_ = static_cast<int>(b_.size()) - 1;
    Step1ab();
    if (k_ > 0) {
      Step1c();
      Step2();
      Step3();
      Step4();
      Step5();
    }
    return b_.substr(0, k_ + 1);
  }

 private:
  bool Cons(int i) const {
    switch (b_[i]) {
      case 'a':
      case 'e':
      case 'i':
      case 'o':
      case 'u':
        return false;
      case 'y':
        return i == 0 ? true : !Cons(i - 1);
      default:
        return true;
    }
  }
  // Number of consonant-vowel sequences in b[0..j].
  int M() const {
    int n = 0, i = 0;
    while (true) {
      if (i > j_) return n;
      if (!Cons(i)) break;
      ++i;
    }
    ++i;
    while (true) {
      while (true) {
        if (i > j_) return n;
        if (Cons(i)) break;
        ++i;
      }
      ++i;
      ++n;
      while (true) {
        if (i > j_) return n;
        if (!Cons(i)) break;
        ++i;
      }
      ++i;
    }
  }
  bool VowelInStem() const {
    for (int i = 0; i <= j_; ++i) {
      if (!Cons(i)) return true;
    }
    return false;
  }
  bool DoubleC(int j) const { return j >= 1 && b_[j] == b_[j - 1] && Cons(j); }
  bool Cvc(int i) const {
    if (i < 2 || !Cons(i) || Cons(i - 1) || !Cons(i - 2)) return false;
    char ch = b_[i];
    return !(ch == 'w' || ch == 'x' || ch == 'y');
  }
  bool Ends(const char* s) {
    int len = static_cast<int>(std::char_traits<char>::length(s));
    if (len > k_ + 1) return false;
    if (b_.compare(k_ - len + 1, len, s) != 0) return false;
    j_ = k_ - len;
    return true;
  }
  void SetTo(const char* s) {
    int len = static_cast<int>(std::char_traits<char>::length(s));
    b_.replace(j_ + 1, k_ - j_, s);
    k_ = j_ + len;
  }
  void R(const char* s) {
    if (M() > 0) SetTo(s);
  }

  void Step1ab() {
    if (b_[k_] == 's') {
      if (Ends("sses")) {
        k_ -= 2;
      } else if (Ends("ies")) {
        SetTo("i");
      } else if (b_[k_ - 1] != 's') {
        --k_;
      }
    }
    b_.resize(k_ + 1);
    if (Ends("eed")) {
      if (M() > 0) --k_;
    } else if ((Ends("ed") || Ends("ing")) && VowelInStem()) {
      k_ = j_;
      b_.resize(k_ + 1);
      if (Ends("at")) {
        SetTo("ate");
      } else if (Ends("bl")) {
        SetTo("ble");
      } else if (Ends("iz")) {
        SetTo("ize");
      } else if (DoubleC(k_)) {
        --k_;
        char ch = b_[k_];
        if (ch == 'l' || ch == 's' || ch == 'z') ++k_;
      } else if (M() == 1 && Cvc(k_)) {
        j_ = k_;
        SetTo("e");
      }
    }
    b_.resize(k_ + 1);
  }
  void Step1c() {
    if (Ends("y") && VowelInStem()) b_[k_] = 'i';
  }
  void Step2() {
    if (k_ < 1) return;
    switch (b_[k_ - 1]) {
      case 'a':
        if (Ends("ational")) {
          R("ate");
          break;
        }
        if (Ends("tional")) {
          R("tion");
          break;
        }
        break;
      case 'c':
        if (Ends("enci")) {
          R("ence");
          break;
        }
        if (Ends("anci")) {
          R("ance");
          break;
        }
        break;
      case 'e':
        if (Ends("izer")) {
          R("ize");
          break;
        }
        break;
      case 'l':
        if (Ends("bli")) {
          R("ble");
          break;
        }
        if (Ends("alli")) {
          R("al");
          break;
        }
        if (Ends("entli")) {
          R("ent");
          break;
        }
        if (Ends("eli")) {
          R("e");
          break;
        }
        if (Ends("ousli")) {
          R("ous");
          break;
        }
        break;
      case 'o':
        if (Ends("ization")) {
          R("ize");
          break;
        }
        if (Ends("ation")) {
          R("ate");
          break;
        }
        if (Ends("ator")) {
          R("ate");
          break;
        }
        break;
      case 's':
        if (Ends("alism")) {
          R("al");
          break;
        }
        if (Ends("iveness")) {
          R("ive");
          break;
        }
        if (Ends("fulness")) {
          R("ful");
          break;
        }
        if (Ends("ousness")) {
          R("ous");
          break;
        }
        break;
      case 't':
        if (Ends("aliti")) {
          R("al");
          break;
        }
        if (Ends("iviti")) {
          R("ive");
          break;
        }
        if (Ends("biliti")) {
          R("ble");
          break;
        }
        break;
      case 'g':
        if (Ends("logi")) {
          R("log");
          break;
        }
        break;
    }
  }
  void Step3() {
    switch (b_[k_]) {
      case 'e':
        if (Ends("icate")) {
          R("ic");
          break;
        }
        if (Ends("ative")) {
          R("");
          break;
        }
        if (Ends("alize")) {
          R("al");
          break;
        }
        break;
      case 'i':
        if (Ends("iciti")) {
          R("ic");
          break;
        }
        break;
      case 'l':
        if (Ends("ical")) {
          R("ic");
          break;
        }
        if (Ends("ful")) {
          R("");
          break;
        }
        break;
      case 's':
        if (Ends("ness")) {
          R("");
          break;
        }
        break;
    }
  }
  void Step4() {
    if (k_ < 1) return;
    switch (b_[k_ - 1]) {
      case 'a':
        if (Ends("al")) break;
        return;
      case 'c':
        if (Ends("ance") || Ends("ence")) break;
        return;
      case 'e':
        if (Ends("er")) break;
        return;
      case 'i':
        if (Ends("ic")) break;
        return;
      case 'l':
        if (Ends("able") || Ends("ible")) break;
        return;
      case 'n':
        if (Ends("ant") || Ends("ement") || Ends("ment") || Ends("ent")) break;
        return;
      case 'o':
        if (Ends("ion") && j_ >= 0 && (b_[j_] == 's' || b_[j_] == 't')) break;
        if (Ends("ou")) break;
        return;
      case 's':
        if (Ends("ism")) break;
        return;
      case 't':
        if (Ends("ate") || Ends("iti")) break;
        return;
      case 'u':
        if (Ends("ous")) break;
        return;
      case 'v':
        if (Ends("ive")) break;
        return;
      case 'z':
        if (Ends("ize")) break;
        return;
      default:
        return;
    }
    if (M() > 1) k_ = j_;
  }
  void Step5() {
    j_ = k_;
    if (b_[k_] == 'e') {
      int a = M();
      if (a > 1 || (a == 1 && !Cvc(k_ - 1))) --k_;
    }
    if (b_[k_] == 'l' && DoubleC(k_) && M() > 1) --k_;
  }

  std::string b_;
  int k_ = 0;
  int j_ = 0;
};

}  // namespace

std::string PorterStem(std::string_view word) {
  for (char c : word) {
    if (c < 'a' || c > 'z') return std::string(word);  // only plain lowercase words
  }
  return Stemmer(std::string(word)).Run();
}

}  // namespace fwai

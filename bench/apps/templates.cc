// Real-program benchmark, g++: a translation unit that instantiates 200
// class templates holding std::map<std::string, std::vector<int>>, plus
// <regex> and <sstream> (the compiler's own allocations: trees, symbol
// tables, template instantiations).
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

template <int N> struct T {
    std::map<std::string, std::vector<int>> m;
    int f() { return (int)m.size() + T<N - 1>().f(); }
};
template <> struct T<0> {
    int f() { return 0; }
};

int main()
{
    std::regex r("a+b");
    std::ostringstream o;
    o << T<200>().f();
    std::cout << o.str() << std::regex_match("aab", r) << std::endl;
}
